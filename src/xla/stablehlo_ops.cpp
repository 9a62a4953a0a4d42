// StableHLO text emission, the ops beyond the first probe's
// (include/strata/xla/stablehlo.h): more element-wise ops, iota, slices,
// concatenation and padding, dynamic slices, the optimization barrier,
// random bits, argmax, and argument donation.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "stablehlo_internal.h"
#include "strata/core/error.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla::stablehlo {
namespace {

using detail::array_attr;
using detail::check_dims;
using detail::check_integer;
using detail::is_integer;
using detail::rank;
using detail::shape_text;

bool is_unsigned(ElementType t) {
  return t == ElementType::kU8 || t == ElementType::kU16 || t == ElementType::kU32 || t == ElementType::kU64;
}

const char* algorithm_name(RngAlgorithm a) {
  switch (a) {
    case RngAlgorithm::kDefault:
      return "DEFAULT";
    case RngAlgorithm::kThreeFry:
      return "THREE_FRY";
    case RngAlgorithm::kPhilox:
      return "PHILOX";
  }
  return "DEFAULT";
}

// A region's body, written op by op with the function's value numbering:
// each op is one line of generic form.
class RegionBody {
 public:
  void op(const std::string& result, const std::string& op, const std::vector<std::string>& operands,
          const std::string& attributes, const std::string& operand_types, const std::string& result_type) {
    std::string line = result + " = \"stablehlo." + op + "\"(";
    for (size_t i = 0; i < operands.size(); ++i) line += (i ? ", " : "") + operands[i];
    line += ")";
    if (!attributes.empty()) line += " {" + attributes + "}";
    text += "\n      " + line + " : (" + operand_types + ") -> " + result_type;
  }
  std::string text;
};

}  // namespace

// ---- Element-wise --------------------------------------------------------------------

Value Function::float_unary(const char* op, const Value& a) {
  check_open(op);
  STRATA_CHECK(is_floating(a.type.dtype), ConfigError, "[stablehlo] ", op, ": needs a float operand, got ",
               a.type.text());
  return emit(op, {a}, "", "", a.type);
}

Value Function::bitwise(const char* op, const Value& a, const Value& b) {
  check_open(op);
  const bool shift = std::string(op).rfind("shift", 0) == 0;
  STRATA_CHECK(is_integer(a.type.dtype) || (!shift && a.type.dtype == ElementType::kPred), ConfigError,
               "[stablehlo] ", op, ": needs ", shift ? "integer" : "bool or integer", " operands, got ",
               a.type.text());
  return binary(op, a, b);
}

Value Function::logical_not(const Value& a) {
  check_open("not");
  STRATA_CHECK(!is_floating(a.type.dtype), ConfigError,
               "[stablehlo] not: needs a bool or integer operand, got ", a.type.text());
  return emit("not", {a}, "", "", a.type);
}

Value Function::sign(const Value& a) {
  check_open("sign");
  STRATA_CHECK(a.type.dtype != ElementType::kPred && !is_unsigned(a.type.dtype), ConfigError,
               "[stablehlo] sign: needs a signed integer or float operand, got ", a.type.text());
  return emit("sign", {a}, "", "", a.type);
}

Value Function::chlo_unary(const char* op, const Value& a) {
  check_open(op);
  STRATA_CHECK(is_floating(a.type.dtype), ConfigError, "[stablehlo] ", op, ": needs a float operand, got ",
               a.type.text());
  // Note [chlo.erf]: StableHLO's core opset has no erf, acos, asin, atan,
  // acosh, asinh, atanh, cosh or sinh. XLA's MLIR import (the path PJRT's
  // "mlir" programs take) legalizes CHLO, as it does for JAX, whose lax.erf
  // and lax.acos emit chlo.erf and chlo.acos; the CPU plugin and jaxlib
  // both accept them, and stablehlo_ops_test.cpp checks erf against
  // std::erf.
  return emit_op(std::string("chlo.") + op, {a}, "", "", {a.type})[0];
}

Value Function::is_finite(const Value& a) {
  check_open("is_finite");
  STRATA_CHECK(is_floating(a.type.dtype), ConfigError, "[stablehlo] is_finite: needs a float operand, got ",
               a.type.text());
  return emit("is_finite", {a}, "", "", {ElementType::kPred, a.type.dims});
}

Value Function::clamp(const Value& lo, const Value& x, const Value& hi) {
  check_open("clamp");
  for (const Value* bound : {&lo, &hi})
    STRATA_CHECK(
        bound->type.dtype == x.type.dtype && (bound->type.dims.empty() || bound->type.dims == x.type.dims),
        ConfigError, "[stablehlo] clamp: a bound must be a ", tensor_type(x.type.dtype, {}), " or a ",
        x.type.text(), ", got ", bound->type.text());
  return emit("clamp", {lo, x, hi}, "", "", x.type);
}

Value Function::bitcast_convert(const Value& x, ElementType dtype) {
  check_open("bitcast_convert");
  STRATA_CHECK(element_size(x.type.dtype) == element_size(dtype) && x.type.dtype != ElementType::kPred &&
                   dtype != ElementType::kPred,
               ConfigError, "[stablehlo] bitcast_convert: ", x.type.text(), " to ", stablehlo_name(dtype),
               " changes the element size; only same-size non-bool types are supported");
  return emit("bitcast_convert", {x}, "", "", {dtype, x.type.dims});
}

Value Function::complex(const Value& re, const Value& im) {
  check_open("complex");
  STRATA_CHECK((re.type.dtype == ElementType::kF32 || re.type.dtype == ElementType::kF64) && re.type == im.type,
               ConfigError, "[stablehlo] complex: needs two f32 or two f64 operands of one shape, got ", re.type.text(),
               " and ", im.type.text());
  return emit("complex", {re, im}, "", "",
              {re.type.dtype == ElementType::kF32 ? ElementType::kC64 : ElementType::kC128, re.type.dims});
}

Value Function::complex_part_of(const char* op, const Value& x) {
  check_open(op);
  STRATA_CHECK(is_complex(x.type.dtype), ConfigError, "[stablehlo] ", op, ": needs a complex operand, got ",
               x.type.text());
  return emit(op, {x}, "", "", {complex_part(x.type.dtype), x.type.dims});
}

Value Function::fft(const Value& x, FftType type, const std::vector<int64_t>& lengths) {
  static const char* const kNames[] = {"FFT", "IFFT", "RFFT", "IRFFT"};
  const char* name = kNames[static_cast<int>(type)];
  check_open("fft");
  const size_t r = x.type.dims.size();
  STRATA_CHECK(!lengths.empty() && lengths.size() <= 3 && lengths.size() <= r, ConfigError, "[stablehlo] fft: ",
               lengths.size(), " lengths for ", x.type.text(), "; give 1 to 3, at most its rank");
  for (int64_t n : lengths)
    STRATA_CHECK(n > 0, ConfigError, "[stablehlo] fft: length ", n, " is not positive");
  Type result = x.type;
  const size_t inner = r - lengths.size();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t want = type == FftType::kRealInverse && i + 1 == lengths.size() ? lengths[i] / 2 + 1 : lengths[i];
    STRATA_CHECK(x.type.dims[inner + i] == want, ConfigError, "[stablehlo] fft ", name, ": dim ", inner + i, " of ",
                 x.type.text(), " is ", x.type.dims[inner + i], ", the lengths ", shape_text(lengths), " need ", want);
  }
  if (type == FftType::kRealForward) {
    STRATA_CHECK(x.type.dtype == ElementType::kF32 || x.type.dtype == ElementType::kF64, ConfigError,
                 "[stablehlo] fft RFFT: needs f32 or f64 values, got ", x.type.text());
    result.dtype = x.type.dtype == ElementType::kF32 ? ElementType::kC64 : ElementType::kC128;
    result.dims.back() = lengths.back() / 2 + 1;
  } else {
    STRATA_CHECK(is_complex(x.type.dtype), ConfigError, "[stablehlo] fft ", name, ": needs complex values, got ",
                 x.type.text());
    if (type == FftType::kRealInverse) {
      result.dtype = complex_part(x.type.dtype);
      result.dims.back() = lengths.back();
    }
  }
  return emit("fft", {x}, "",
              std::string("fft_type = #stablehlo<fft_type ") + name + ">, fft_length = " + array_attr(lengths), result);
}

// ---- Shapes and indexing ---------------------------------------------------------------

Value Function::iota(const Type& type, int64_t dim) {
  check_open("iota");
  STRATA_CHECK(dim >= 0 && dim < static_cast<int64_t>(type.dims.size()), ConfigError,
               "[stablehlo] iota: dimension ", dim, " is out of range for ", type.text());
  STRATA_CHECK(type.dtype != ElementType::kPred, ConfigError, "[stablehlo] iota: bool has no iota");
  return emit("iota", {}, "", "iota_dimension = " + std::to_string(dim) + " : i64", type);
}

Value Function::slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                      const std::vector<int64_t>& strides) {
  check_open("slice");
  const size_t n = x.type.dims.size();
  const std::vector<int64_t> step = strides.empty() ? std::vector<int64_t>(n, 1) : strides;
  STRATA_CHECK(start.size() == n && limit.size() == n && step.size() == n, ConfigError,
               "[stablehlo] slice: ", x.type.text(), " needs ", n, " starts, limits and strides, got ",
               start.size(), ", ", limit.size(), " and ", step.size());
  Type result{x.type.dtype, {}};
  for (size_t d = 0; d < n; ++d) {
    STRATA_CHECK(0 <= start[d] && start[d] <= limit[d] && limit[d] <= x.type.dims[d] && step[d] >= 1,
                 ConfigError, "[stablehlo] slice: dim ", d, " of ", x.type.text(), " cannot take [", start[d],
                 ":", limit[d], ":", step[d], "]");
    result.dims.push_back((limit[d] - start[d] + step[d] - 1) / step[d]);
  }
  return emit("slice", {x}, "",
              "limit_indices = " + array_attr(limit) + ", start_indices = " + array_attr(start) +
                  ", strides = " + array_attr(step),
              result);
}

Value Function::concatenate(const std::vector<Value>& values, int64_t dim) {
  check_open("concatenate");
  STRATA_CHECK(!values.empty(), ConfigError, "[stablehlo] concatenate: no operands");
  const Type& first = values[0].type;
  check_dims("concatenate", {dim}, first.dims.size());
  Type result = first;
  result.dims[static_cast<size_t>(dim)] = 0;
  for (const Value& v : values) {
    bool same = v.type.dtype == first.dtype && v.type.dims.size() == first.dims.size();
    for (size_t d = 0; same && d < first.dims.size(); ++d)
      same = static_cast<int64_t>(d) == dim || v.type.dims[d] == first.dims[d];
    STRATA_CHECK(same, ConfigError, "[stablehlo] concatenate: ", v.type.text(), " does not join ",
                 first.text(), " along dim ", dim);
    result.dims[static_cast<size_t>(dim)] += v.type.dims[static_cast<size_t>(dim)];
  }
  return emit("concatenate", values, "", "dimension = " + std::to_string(dim) + " : i64", result);
}

Value Function::pad(const Value& x, const Value& value, const std::vector<int64_t>& low,
                    const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  check_open("pad");
  STRATA_CHECK(value.type.dims.empty() && value.type.dtype == x.type.dtype, ConfigError,
               "[stablehlo] pad: the padding value must be a ", tensor_type(x.type.dtype, {}), ", got ",
               value.type.text());
  const size_t n = x.type.dims.size();
  STRATA_CHECK(low.size() == n && high.size() == n && interior.size() == n, ConfigError,
               "[stablehlo] pad: ", x.type.text(), " needs ", n, " low, high and interior paddings, got ",
               low.size(), ", ", high.size(), " and ", interior.size());
  Type result{x.type.dtype, {}};
  for (size_t d = 0; d < n; ++d) {
    const int64_t size = x.type.dims[d];
    const int64_t padded = low[d] + high[d] + size + (size > 0 ? (size - 1) * interior[d] : 0);
    STRATA_CHECK(interior[d] >= 0 && padded >= 0, ConfigError, "[stablehlo] pad: dim ", d, " of ",
                 x.type.text(), " cannot take low ", low[d], ", high ", high[d], ", interior ", interior[d]);
    result.dims.push_back(padded);
  }
  return emit("pad", {x, value}, "",
              "edge_padding_high = " + array_attr(high) + ", edge_padding_low = " + array_attr(low) +
                  ", interior_padding = " + array_attr(interior),
              result);
}

namespace {

void check_starts(const char* op, const Value& x, const std::vector<Value>& start) {
  STRATA_CHECK(start.size() == x.type.dims.size(), ConfigError, "[stablehlo] ", op, ": ", x.type.text(),
               " needs ", x.type.dims.size(), " start indices, got ", start.size());
  for (const Value& s : start) {
    check_integer(op, "start indices", s);
    STRATA_CHECK(s.type.dims.empty() && s.type == start[0].type, ConfigError, "[stablehlo] ", op,
                 ": start indices must be scalars of one type, got ", s.type.text(), " and ",
                 start[0].type.text());
  }
}

}  // namespace

Value Function::dynamic_slice(const Value& x, const std::vector<Value>& start,
                              const std::vector<int64_t>& sizes) {
  check_open("dynamic_slice");
  check_starts("dynamic_slice", x, start);
  STRATA_CHECK(sizes.size() == x.type.dims.size(), ConfigError, "[stablehlo] dynamic_slice: ", x.type.text(),
               " needs ", x.type.dims.size(), " slice sizes, got ", sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d)
    STRATA_CHECK(sizes[d] >= 0 && sizes[d] <= x.type.dims[d], ConfigError, "[stablehlo] dynamic_slice: size ",
                 sizes[d], " does not fit dim ", d, " of ", x.type.text());
  std::vector<Value> operands{x};
  operands.insert(operands.end(), start.begin(), start.end());
  return emit("dynamic_slice", operands, "", "slice_sizes = " + array_attr(sizes), {x.type.dtype, sizes});
}

Value Function::dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& start) {
  check_open("dynamic_update_slice");
  check_starts("dynamic_update_slice", x, start);
  bool fits = update.type.dtype == x.type.dtype && update.type.dims.size() == x.type.dims.size();
  for (size_t d = 0; fits && d < x.type.dims.size(); ++d) fits = update.type.dims[d] <= x.type.dims[d];
  STRATA_CHECK(fits, ConfigError, "[stablehlo] dynamic_update_slice: the update ", update.type.text(),
               " does not fit in ", x.type.text());
  std::vector<Value> operands{x, update};
  operands.insert(operands.end(), start.begin(), start.end());
  return emit("dynamic_update_slice", operands, "", "", x.type);
}

// ---- Several results -------------------------------------------------------------------

std::vector<Value> Function::optimization_barrier(const std::vector<Value>& values) {
  check_open("optimization_barrier");
  STRATA_CHECK(!values.empty(), ConfigError, "[stablehlo] optimization_barrier: no operands");
  std::vector<Type> types;
  for (const Value& v : values) types.push_back(v.type);
  return emit_op("stablehlo.optimization_barrier", values, "", "", types);
}

std::vector<Value> Function::rng_bit_generator(const Value& state, const Type& type, RngAlgorithm algorithm) {
  check_open("rng_bit_generator");
  const int64_t n = state.type.dims.size() == 1 ? state.type.dims[0] : -1;
  const bool ok =
      state.type.dtype == ElementType::kU64 &&
      (algorithm == RngAlgorithm::kDefault ? n >= 1
                                           : n == 2 || (algorithm == RngAlgorithm::kPhilox && n == 3));
  STRATA_CHECK(ok, ConfigError, "[stablehlo] rng_bit_generator: the state of ", algorithm_name(algorithm),
               " must be a tensor<2xui64>", algorithm == RngAlgorithm::kPhilox ? " or tensor<3xui64>" : "",
               ", got ", state.type.text());
  STRATA_CHECK(is_integer(type.dtype), ConfigError,
               "[stablehlo] rng_bit_generator: the bits must be integers, got ", type.text());
  return emit_op("stablehlo.rng_bit_generator", {state}, "",
                 std::string("rng_algorithm = #stablehlo<rng_algorithm ") + algorithm_name(algorithm) + ">",
                 {state.type, type});
}

std::vector<Value> Function::uniform(const Value& state, const std::vector<int64_t>& dims) {
  const Type bits_type{ElementType::kU32, dims};
  const std::vector<Value> generated = rng_bit_generator(state, bits_type, RngAlgorithm::kThreeFry);
  // Note [Uniform floats]: 23 random mantissa bits under the exponent of
  // 1.0 give a float in [1, 2); subtracting 1 leaves [0, 1) in steps of
  // 2^-23, every value equally likely.
  const Value mantissa = shift_right_logical(generated[1], constant(bits_type, {9}));
  const Value one_to_two =
      bitcast_convert(logical_or(mantissa, constant(bits_type, {0x3F800000})), ElementType::kF32);
  return {generated[0], subtract(one_to_two, constant({ElementType::kF32, dims}, {1.0}))};
}

std::vector<Value> Function::argmax(const Value& x, int64_t dim, ElementType index_dtype) {
  check_open("argmax");
  check_dims("argmax", {dim}, x.type.dims.size());
  STRATA_CHECK(is_integer(index_dtype), ConfigError,
               "[stablehlo] argmax: the index type must be an integer, got ", stablehlo_name(index_dtype));
  const ElementType t = x.type.dtype;
  const bool floating = is_floating(t);
  const double lowest = floating ? -std::numeric_limits<double>::infinity()
                        : is_unsigned(t) || t == ElementType::kPred
                            ? 0.0
                            : -std::ldexp(1.0, static_cast<int>(element_size(t)) * 8 - 1);
  const Value init = constant({t, {}}, {lowest});
  const Value zero = constant({index_dtype, {}}, {0});
  const Value index = iota({index_dtype, x.type.dims}, dim);

  // Note [Argmax region]: a (value, index) pair wins when its value is
  // larger, or is nan while the other's is not; on equal values (or two
  // nans) the smaller index wins, so the result is the first maximum
  // whatever order XLA reduces in, as torch.max returns.
  const std::string v = tensor_type(t, {}), i = tensor_type(index_dtype, {}),
                    b = tensor_type(ElementType::kPred, {});
  const std::string a_v = fresh(), a_i = fresh(), b_v = fresh(), b_i = fresh();
  RegionBody body;
  auto cmp = [&](const std::string& l, const std::string& r, const char* dir, const std::string& type) {
    const std::string out = fresh();
    body.op(out, "compare", {l, r},
            std::string("comparison_direction = #stablehlo<comparison_direction ") + dir + ">",
            type + ", " + type, b);
    return out;
  };
  auto logic = [&](const char* op, const std::string& l, const std::string& r) {
    const std::string out = fresh();
    body.op(out, op, {l, r}, "", b + ", " + b, b);
    return out;
  };
  std::string wins = cmp(a_v, b_v, "GT", v);
  std::string same = cmp(a_v, b_v, "EQ", v);
  if (floating) {
    const std::string a_nan = cmp(a_v, a_v, "NE", v), b_nan = cmp(b_v, b_v, "NE", v);
    const std::string b_num = fresh();
    body.op(b_num, "not", {b_nan}, "", b, b);
    wins = logic("or", wins, logic("and", a_nan, b_num));
    same = logic("or", same, logic("and", a_nan, b_nan));
  }
  const std::string pick = logic("or", wins, logic("and", same, cmp(a_i, b_i, "LT", i)));
  const std::string out_v = fresh(), out_i = fresh();
  body.op(out_v, "select", {pick, a_v, b_v}, "", b + ", " + v + ", " + v, v);
  body.op(out_i, "select", {pick, a_i, b_i}, "", b + ", " + i + ", " + i, i);
  const std::string region = "{\n    ^bb0(" + a_v + ": " + v + ", " + a_i + ": " + i + ", " + b_v + ": " + v +
                             ", " + b_i + ": " + i + "):" + body.text + "\n      \"stablehlo.return\"(" +
                             out_v + ", " + out_i + ") : (" + v + ", " + i + ") -> ()\n  }";
  Type values{t, {}}, indices{index_dtype, {}};
  for (int64_t d = 0; d < rank(x); ++d)
    if (d != dim) {
      values.dims.push_back(x.type.dims[static_cast<size_t>(d)]);
      indices.dims.push_back(x.type.dims[static_cast<size_t>(d)]);
    }
  return emit_op("stablehlo.reduce", {x, index, init, zero}, region, "dimensions = " + array_attr({dim}),
                 {values, indices});
}

// ---- Donation ---------------------------------------------------------------------------

// Note [Donation]: XLA's MLIR import turns `tf.aliasing_output = N` on an
// argument into an input/output alias (the output is written in the
// argument's buffer) and `jax.buffer_donor = true` into a buffer donor (XLA
// may reuse it for any output). Either way PJRT consumes the caller's
// buffer at execution: it is deleted afterwards, and reading it fails.
// text() checks an aliased output's type once the results are known.
void Function::donate(size_t arg, int64_t output) {
  check_open("donate");
  STRATA_CHECK(arg < args_.size(), ConfigError, "[stablehlo] donate: ", name_, " has ", args_.size(),
               " arguments, asked for ", arg);
  STRATA_CHECK(output >= -1, ConfigError, "[stablehlo] donate: output ", output,
               " is not an output index (or -1 for any output)");
  donated_[arg] = output;
}

}  // namespace strata::xla::stablehlo
