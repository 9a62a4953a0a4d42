// StableHLO text emission (include/strata/xla/stablehlo.h).
#include "strata/xla/stablehlo.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "stablehlo_internal.h"
#include "strata/core/error.h"

namespace strata::xla::stablehlo {
namespace {

using detail::array_attr;
using detail::check_dims;
using detail::join;
using detail::shape_text;

std::string types_of(const std::vector<Value>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + values[i].type.text();
  return out;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "add";
    case ReduceOp::kProduct:
      return "multiply";
    case ReduceOp::kMax:
      return "maximum";
    case ReduceOp::kMin:
      return "minimum";
  }
  return "add";
}

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::kEQ:
      return "EQ";
    case Direction::kNE:
      return "NE";
    case Direction::kLT:
      return "LT";
    case Direction::kLE:
      return "LE";
    case Direction::kGT:
      return "GT";
    case Direction::kGE:
      return "GE";
  }
  return "EQ";
}

// The bits of a non-finite value in `dtype`, as MLIR's hex float literal.
std::string hex_literal(double value, ElementType dtype) {
  char buf[32];
  if (dtype == ElementType::kF64) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
    return buf;
  }
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (dtype == ElementType::kF32) {
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
  } else if (dtype == ElementType::kBF16) {
    std::snprintf(buf, sizeof buf, "0x%04X", bits >> 16);
  } else {  // f16: sign, then all-ones exponent; quiet nan
    const unsigned sign = (bits >> 31) ? 0x8000u : 0u;
    std::snprintf(buf, sizeof buf, "0x%04X", sign | (std::isnan(value) ? 0x7E00u : 0x7C00u));
  }
  return buf;
}

}  // namespace

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string element_literal(double value, ElementType dtype) {
  if (dtype == ElementType::kPred) return value != 0 ? "true" : "false";
  if (!is_floating(dtype)) {
    STRATA_CHECK(std::isfinite(value) && value == std::floor(value), ConfigError, "[stablehlo] constant ",
                 value, " is not an integer, but the element type is ", stablehlo_name(dtype));
    return std::to_string(static_cast<int64_t>(value));
  }
  if (!std::isfinite(value)) return hex_literal(value, dtype);
  char buf[40];
  std::snprintf(buf, sizeof buf, dtype == ElementType::kF64 ? "%.17g" : "%.9g", value);
  std::string text = buf;
  // MLIR's float literals need a '.' before any exponent ("1.0e+20").
  if (text.find('.') == std::string::npos) {
    const size_t e = text.find('e');
    text.insert(e == std::string::npos ? text.size() : e, ".0");
  }
  return text;
}

std::string replica_groups_attribute(const ReplicaGroups& groups) {
  STRATA_CHECK(!groups.empty() && !groups[0].empty(), ConfigError, "[stablehlo] replica groups are empty");
  std::string out = "dense<[";
  for (size_t g = 0; g < groups.size(); ++g) {
    STRATA_CHECK(groups[g].size() == groups[0].size(), ConfigError, "[stablehlo] replica group ", g, " has ",
                 groups[g].size(), " replicas, group 0 has ", groups[0].size(),
                 "; groups must be the same size");
    out += (g ? ", [" : "[") + join(groups[g]) + "]";
  }
  return out + "]> : tensor<" + std::to_string(groups.size()) + "x" + std::to_string(groups[0].size()) +
         "xi64>";
}

// ---- Function ----------------------------------------------------------------------

Function::Function(std::string name, std::vector<Type> params) : name_(std::move(name)) {
  for (size_t i = 0; i < params.size(); ++i)
    args_.push_back({"%arg" + std::to_string(i), std::move(params[i])});
  donated_.assign(args_.size(), -2);
}

const Value& Function::arg(size_t i) const {
  STRATA_CHECK(i < args_.size(), ConfigError, "[stablehlo] ", name_, " has ", args_.size(),
               " arguments, asked for ", i);
  return args_[i];
}

std::string Function::fresh() { return "%" + std::to_string(next_++); }

void Function::check_open(const char* op) const {
  STRATA_CHECK(!closed_, ConfigError, "[stablehlo] ", op, " after returns() in ", name_);
}

Value Function::emit(const std::string& op, const std::vector<Value>& operands, const std::string& region,
                     const std::string& attributes, const Type& result) {
  return emit_op("stablehlo." + op, operands, region, attributes, {result})[0];
}

std::vector<Value> Function::emit_op(const std::string& op, const std::vector<Value>& operands,
                                     const std::string& region, const std::string& attributes,
                                     const std::vector<Type>& results) {
  const std::string name = fresh();
  std::vector<Value> out;
  for (size_t i = 0; i < results.size(); ++i)
    out.push_back({results.size() == 1 ? name : name + "#" + std::to_string(i), results[i]});
  std::string line =
      name + (results.size() == 1 ? "" : ":" + std::to_string(results.size())) + " = \"" + op + "\"(";
  for (size_t i = 0; i < operands.size(); ++i) line += (i ? ", " : "") + operands[i].name;
  line += ")";
  if (!region.empty()) line += " (" + region + ")";
  if (!attributes.empty()) line += " {" + attributes + "}";
  line += " : (" + types_of(operands) + ") -> ";
  line += results.size() == 1 ? results[0].text() : "(" + types_of(out) + ")";
  lines_.push_back(std::move(line));
  return out;
}

std::string Function::reduction_region(ReduceOp op, ElementType dtype) {
  const std::string scalar = tensor_type(dtype, {});
  const std::string a = fresh(), b = fresh(), r = fresh();
  return "{\n    ^bb0(" + a + ": " + scalar + ", " + b + ": " + scalar + "):\n      " + r +
         " = \"stablehlo." + reduce_op_name(op) + "\"(" + a + ", " + b + ") : (" + scalar + ", " + scalar +
         ") -> " + scalar + "\n      \"stablehlo.return\"(" + r + ") : (" + scalar + ") -> ()\n  }";
}

std::string Function::replace_region(ElementType dtype) {
  const std::string scalar = tensor_type(dtype, {});
  const std::string a = fresh(), b = fresh();
  return "{\n    ^bb0(" + a + ": " + scalar + ", " + b + ": " + scalar + "):\n      \"stablehlo.return\"(" + b +
         ") : (" + scalar + ") -> ()\n  }";
}

Value Function::constant(const Type& type, const std::vector<double>& values) {
  check_open("constant");
  STRATA_CHECK(!is_complex(type.dtype), ConfigError, "[stablehlo] constant of ", type.text(),
               ": complex constants are not printed; build them with complex(re, im)");
  const int64_t n = type.numel();
  STRATA_CHECK(values.size() == 1 || static_cast<int64_t>(values.size()) == n, ConfigError,
               "[stablehlo] constant of ", type.text(), " needs 1 or ", n, " values, got ", values.size());
  std::string dense;
  if (values.size() == 1 && n != 1) {
    dense = element_literal(values[0], type.dtype);  // a splat
  } else if (type.dims.empty()) {
    dense = element_literal(values[0], type.dtype);
  } else {
    // Nested brackets, one level per dimension, row-major.
    std::vector<int64_t> index(type.dims.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      size_t opened = 0;
      for (size_t d = type.dims.size(); d-- > 0 && index[d] == 0;) ++opened;
      if (i > 0) dense += ", ";
      dense += std::string(opened, '[') + element_literal(values[static_cast<size_t>(i)], type.dtype);
      size_t closed = 0;
      for (size_t d = type.dims.size(); d-- > 0;) {
        if (++index[d] < type.dims[d]) break;
        index[d] = 0;
        ++closed;
      }
      dense += std::string(closed, ']');
    }
    if (n == 0) dense = std::string(type.dims.size(), '[') + std::string(type.dims.size(), ']');
  }
  return emit("constant", {}, "", "value = dense<" + dense + "> : " + type.text(), type);
}

Value Function::binary(const char* op, const Value& a, const Value& b) {
  check_open(op);
  STRATA_CHECK(a.type == b.type, ConfigError, "[stablehlo] ", op, ": operand types differ: ", a.type.text(),
               " and ", b.type.text());
  return emit(op, {a, b}, "", "", a.type);
}

Value Function::unary(const char* op, const Value& a) {
  check_open(op);
  return emit(op, {a}, "", "", a.type);
}

Value Function::dot_general(const Value& lhs, const Value& rhs, const DotDims& dims) {
  check_open("dot_general");
  STRATA_CHECK(lhs.type.dtype == rhs.type.dtype, ConfigError,
               "[stablehlo] dot_general: element types differ: ", lhs.type.text(), " and ", rhs.type.text());
  STRATA_CHECK(
      dims.lhs_batch.size() == dims.rhs_batch.size() && dims.lhs_contract.size() == dims.rhs_contract.size(),
      ConfigError,
      "[stablehlo] dot_general: lhs and rhs list different numbers of batch or contracting dims");
  check_dims("dot_general", dims.lhs_batch, lhs.type.dims.size());
  check_dims("dot_general", dims.rhs_batch, rhs.type.dims.size());
  check_dims("dot_general", dims.lhs_contract, lhs.type.dims.size());
  check_dims("dot_general", dims.rhs_contract, rhs.type.dims.size());
  Type result{lhs.type.dtype, {}};
  for (size_t i = 0; i < dims.lhs_batch.size(); ++i) {
    const int64_t l = lhs.type.dims[dims.lhs_batch[i]], r = rhs.type.dims[dims.rhs_batch[i]];
    STRATA_CHECK(l == r, ConfigError, "[stablehlo] dot_general: batch dim sizes differ: ", l, " and ", r);
    result.dims.push_back(l);
  }
  for (size_t i = 0; i < dims.lhs_contract.size(); ++i) {
    const int64_t l = lhs.type.dims[dims.lhs_contract[i]], r = rhs.type.dims[dims.rhs_contract[i]];
    STRATA_CHECK(l == r, ConfigError, "[stablehlo] dot_general: contracting dim sizes differ: ", l, " and ",
                 r);
  }
  auto free_dims = [&result](const Type& t, const std::vector<int64_t>& batch,
                             const std::vector<int64_t>& contract) {
    for (int64_t d = 0; d < static_cast<int64_t>(t.dims.size()); ++d)
      if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
          std::find(contract.begin(), contract.end(), d) == contract.end())
        result.dims.push_back(t.dims[static_cast<size_t>(d)]);
  };
  free_dims(lhs.type, dims.lhs_batch, dims.lhs_contract);
  free_dims(rhs.type, dims.rhs_batch, dims.rhs_contract);
  std::string numbers;
  auto field = [&numbers](const char* name, const std::vector<int64_t>& v) {
    if (v.empty()) return;
    numbers += (numbers.empty() ? "" : ", ") + std::string(name) + " = [" + join(v) + "]";
  };
  field("lhs_batching_dimensions", dims.lhs_batch);
  field("rhs_batching_dimensions", dims.rhs_batch);
  field("lhs_contracting_dimensions", dims.lhs_contract);
  field("rhs_contracting_dimensions", dims.rhs_contract);
  return emit("dot_general", {lhs, rhs}, "", "dot_dimension_numbers = #stablehlo.dot<" + numbers + ">",
              result);
}

Value Function::reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims, ReduceOp op) {
  check_open("reduce");
  STRATA_CHECK(init.type.dims.empty() && init.type.dtype == x.type.dtype, ConfigError,
               "[stablehlo] reduce: the initial value must be a ", tensor_type(x.type.dtype, {}), ", got ",
               init.type.text());
  check_dims("reduce", dims, x.type.dims.size());
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  Type result{x.type.dtype, {}};
  for (int64_t d = 0; d < static_cast<int64_t>(x.type.dims.size()); ++d)
    if (!std::binary_search(sorted.begin(), sorted.end(), d))
      result.dims.push_back(x.type.dims[static_cast<size_t>(d)]);
  const std::string region = reduction_region(op, x.type.dtype);
  return emit("reduce", {x, init}, region, "dimensions = " + array_attr(sorted), result);
}

Value Function::broadcast_in_dim(const Value& x, const std::vector<int64_t>& dims,
                                 const std::vector<int64_t>& broadcast_dims) {
  check_open("broadcast_in_dim");
  STRATA_CHECK(broadcast_dims.size() == x.type.dims.size(), ConfigError,
               "[stablehlo] broadcast_in_dim: ", broadcast_dims.size(),
               " broadcast dims for an operand of rank ", x.type.dims.size());
  check_dims("broadcast_in_dim", broadcast_dims, dims.size());
  for (size_t i = 0; i < broadcast_dims.size(); ++i) {
    const int64_t from = x.type.dims[i], to = dims[static_cast<size_t>(broadcast_dims[i])];
    STRATA_CHECK(from == to || from == 1, ConfigError, "[stablehlo] broadcast_in_dim: operand dim ", i, " (",
                 from, ") cannot broadcast to ", to);
  }
  return emit("broadcast_in_dim", {x}, "", "broadcast_dimensions = " + array_attr(broadcast_dims),
              {x.type.dtype, dims});
}

Value Function::reshape(const Value& x, const std::vector<int64_t>& dims) {
  check_open("reshape");
  const Type result{x.type.dtype, dims};
  STRATA_CHECK(result.numel() == x.type.numel(), ConfigError, "[stablehlo] reshape: ", x.type.text(), " has ",
               x.type.numel(), " elements, ", shape_text(dims), " has ", result.numel());
  return emit("reshape", {x}, "", "", result);
}

Value Function::transpose(const Value& x, const std::vector<int64_t>& permutation) {
  check_open("transpose");
  STRATA_CHECK(permutation.size() == x.type.dims.size(), ConfigError, "[stablehlo] transpose: permutation ",
               shape_text(permutation), " for rank ", x.type.dims.size());
  check_dims("transpose", permutation, x.type.dims.size());
  Type result{x.type.dtype, {}};
  for (int64_t p : permutation) result.dims.push_back(x.type.dims[static_cast<size_t>(p)]);
  return emit("transpose", {x}, "", "permutation = " + array_attr(permutation), result);
}

Value Function::convert(const Value& x, ElementType dtype) {
  check_open("convert");
  return emit("convert", {x}, "", "", {dtype, x.type.dims});
}

Value Function::compare(const Value& a, const Value& b, Direction direction) {
  check_open("compare");
  STRATA_CHECK(a.type == b.type, ConfigError, "[stablehlo] compare: operand types differ: ", a.type.text(),
               " and ", b.type.text());
  return emit("compare", {a, b}, "",
              std::string("comparison_direction = #stablehlo<comparison_direction ") +
                  direction_name(direction) + ">",
              {ElementType::kPred, a.type.dims});
}

Value Function::select(const Value& pred, const Value& on_true, const Value& on_false) {
  check_open("select");
  STRATA_CHECK(pred.type.dtype == ElementType::kPred && pred.type.dims == on_true.type.dims, ConfigError,
               "[stablehlo] select: the predicate must be bool with the operands' shape, got ",
               pred.type.text());
  STRATA_CHECK(on_true.type == on_false.type, ConfigError,
               "[stablehlo] select: operand types differ: ", on_true.type.text(), " and ",
               on_false.type.text());
  return emit("select", {pred, on_true, on_false}, "", "", on_true.type);
}

Value Function::all_reduce(const Value& x, ReduceOp op, const ReplicaGroups& groups) {
  check_open("all_reduce");
  const std::string attr = "replica_groups = " + replica_groups_attribute(groups);
  const std::string region = reduction_region(op, x.type.dtype);
  return emit("all_reduce", {x}, region, attr, x.type);
}

Value Function::all_gather(const Value& x, int64_t dim, const ReplicaGroups& groups) {
  check_open("all_gather");
  check_dims("all_gather", {dim}, x.type.dims.size());
  const std::string attr = "all_gather_dim = " + std::to_string(dim) +
                           " : i64, replica_groups = " + replica_groups_attribute(groups);
  Type result = x.type;
  result.dims[static_cast<size_t>(dim)] *= static_cast<int64_t>(groups[0].size());
  return emit("all_gather", {x}, "", attr, result);
}

Value Function::reduce_scatter(const Value& x, int64_t dim, ReduceOp op, const ReplicaGroups& groups) {
  check_open("reduce_scatter");
  check_dims("reduce_scatter", {dim}, x.type.dims.size());
  const std::string attr = "replica_groups = " + replica_groups_attribute(groups) +
                           ", scatter_dimension = " + std::to_string(dim) + " : i64";
  const int64_t n = static_cast<int64_t>(groups[0].size());
  Type result = x.type;
  STRATA_CHECK(result.dims[static_cast<size_t>(dim)] % n == 0, ConfigError,
               "[stablehlo] reduce_scatter: dim ", dim, " of ", x.type.text(), " does not split into ", n,
               " equal parts");
  result.dims[static_cast<size_t>(dim)] /= n;
  const std::string region = reduction_region(op, x.type.dtype);
  return emit("reduce_scatter", {x}, region, attr, result);
}

void Function::returns(const std::vector<Value>& results) {
  check_open("returns");
  STRATA_CHECK(!results.empty(), ConfigError, "[stablehlo] ", name_, " returns nothing");
  std::string names;
  for (size_t i = 0; i < results.size(); ++i) {
    names += (i ? ", " : "") + results[i].name;
    results_.push_back(results[i].type);
  }
  lines_.push_back("return " + names + " : " + types_of(results));
  closed_ = true;
}

std::string Function::text() const {
  STRATA_CHECK(closed_, ConfigError, "[stablehlo] ", name_, " has no returns()");
  std::string out = "func.func public @" + name_ + "(";
  for (size_t i = 0; i < args_.size(); ++i) {
    out += (i ? ", " : "") + args_[i].name + ": " + args_[i].type.text();
    // Note [Donation]: XLA's MLIR import reads these argument attributes.
    const int64_t d = donated_[i];
    STRATA_CHECK(d < static_cast<int64_t>(results_.size()), ConfigError, "[stablehlo] donate: argument ", i,
                 " of ", name_, " aliases output ", d, ", but there are ", results_.size(), " outputs");
    if (d >= 0) {
      STRATA_CHECK(results_[static_cast<size_t>(d)] == args_[i].type, ConfigError,
                   "[stablehlo] donate: argument ", i, " of ", name_, " is ", args_[i].type.text(),
                   ", output ", d, " is ", results_[static_cast<size_t>(d)].text(),
                   "; an aliased output must have its type");
      out += " {tf.aliasing_output = " + std::to_string(d) + " : i32}";
    } else if (d == -1) {
      out += " {jax.buffer_donor = true}";
    }
  }
  out += ") -> (";
  for (size_t i = 0; i < results_.size(); ++i) out += (i ? ", " : "") + results_[i].text();
  out += ") {\n";
  for (const std::string& line : lines_) {
    // Region lines carry their own newlines; indent every line by four.
    std::string indented = "    ";
    for (char c : line) {
      indented += c;
      if (c == '\n') indented += "  ";
    }
    out += indented + "\n";
  }
  return out + "  }\n";
}

// ---- Module ---------------------------------------------------------------------------

Module::Module(std::string name, int64_t num_replicas, int64_t num_partitions)
    : name_(std::move(name)), num_replicas_(num_replicas), num_partitions_(num_partitions) {
  STRATA_CHECK(num_replicas_ >= 1 && num_partitions_ >= 1, ConfigError,
               "[stablehlo] a module needs >= 1 replica and partition, got ", num_replicas_, " and ",
               num_partitions_);
}

void Module::add(const Function& function) { functions_.push_back(function.text()); }

std::string Module::text() const {
  std::string out = "module @" + name_ +
                    " attributes {mhlo.num_partitions = " + std::to_string(num_partitions_) +
                    " : i32, mhlo.num_replicas = " + std::to_string(num_replicas_) + " : i32} {\n";
  for (const std::string& f : functions_) out += "  " + f;
  return out + "}\n";
}

}  // namespace strata::xla::stablehlo
