// StableHLO text emission, the window ops of convolutional models:
// convolution (forward, and the transposes a backward is made of),
// reduce_window (pooling; a variadic form carries the argmax of max
// pooling), and reverse (the flipped kernel of an input gradient). Shapes
// follow the StableHLO spec's inference rules; include/strata/xla/stablehlo.h
// has the contract.
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
using detail::is_integer;
using detail::join;
using detail::rank;
using detail::shape_text;

// `values`, or `n` copies of `fill` when empty; throws unless there are n.
std::vector<int64_t> per_dim(const char* op, const char* name, const std::vector<int64_t>& values, size_t n,
                             int64_t fill) {
  if (values.empty()) return std::vector<int64_t>(n, fill);
  STRATA_CHECK(values.size() == n, ConfigError, "[stablehlo] ", op, ": ", name, " ", shape_text(values),
               " needs ", n, " entries");
  return values;
}

void check_positive(const char* op, const char* name, const std::vector<int64_t>& values) {
  for (int64_t v : values)
    STRATA_CHECK(v >= 1, ConfigError, "[stablehlo] ", op, ": ", name, " ", shape_text(values),
                 " must be positive");
}

// "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>".
std::string padding_attr(const std::vector<int64_t>& low, const std::vector<int64_t>& high) {
  std::string out = "dense<[";
  for (size_t i = 0; i < low.size(); ++i)
    out += (i ? ", [" : "[") + std::to_string(low[i]) + ", " + std::to_string(high[i]) + "]";
  return out + "]> : tensor<" + std::to_string(low.size()) + "x2xi64>";
}

// The number of windows along one dim: the (dilated, padded) base over
// the (dilated) window at `stride`, 0 where the window does not fit.
int64_t windows(int64_t size, int64_t base_dilation, int64_t low, int64_t high, int64_t window,
                int64_t window_dilation, int64_t stride) {
  const int64_t base = size == 0 ? 0 : (size - 1) * base_dilation + 1;
  const int64_t padded = base + low + high;
  const int64_t span = (window - 1) * window_dilation + 1;
  return padded < span ? 0 : (padded - span) / stride + 1;
}

// The operand's window, every list filled in and checked.
Function::Window full_window(const char* op, const Value& x, const Function::Window& w) {
  const size_t n = x.type.dims.size();
  Function::Window out;
  STRATA_CHECK(w.dimensions.size() == n, ConfigError, "[stablehlo] ", op, ": ", x.type.text(), " needs ", n,
               " window dimensions, got ", shape_text(w.dimensions));
  out.dimensions = w.dimensions;
  out.strides = per_dim(op, "window_strides", w.strides, n, 1);
  out.base_dilations = per_dim(op, "base_dilations", w.base_dilations, n, 1);
  out.window_dilations = per_dim(op, "window_dilations", w.window_dilations, n, 1);
  out.padding_low = per_dim(op, "padding (low)", w.padding_low, n, 0);
  out.padding_high = per_dim(op, "padding (high)", w.padding_high, n, 0);
  check_positive(op, "window_dimensions", out.dimensions);
  check_positive(op, "window_strides", out.strides);
  check_positive(op, "base_dilations", out.base_dilations);
  check_positive(op, "window_dilations", out.window_dilations);
  return out;
}

std::vector<int64_t> window_result_dims(const Value& x, const Function::Window& w) {
  std::vector<int64_t> dims;
  for (size_t d = 0; d < x.type.dims.size(); ++d)
    dims.push_back(windows(x.type.dims[d], w.base_dilations[d], w.padding_low[d], w.padding_high[d],
                           w.dimensions[d], w.window_dilations[d], w.strides[d]));
  return dims;
}

std::string window_attrs(const Function::Window& w) {
  return "base_dilations = " + array_attr(w.base_dilations) +
         ", padding = " + padding_attr(w.padding_low, w.padding_high) +
         ", window_dilations = " + array_attr(w.window_dilations) +
         ", window_dimensions = " + array_attr(w.dimensions) + ", window_strides = " + array_attr(w.strides);
}

// One op line of a region's body, in generic form.
std::string region_op(const std::string& result, const std::string& op, const std::vector<std::string>& operands,
                      const std::string& attributes, const std::string& operand_types,
                      const std::string& result_type) {
  std::string line = "\n      " + result + " = \"stablehlo." + op + "\"(";
  for (size_t i = 0; i < operands.size(); ++i) line += (i ? ", " : "") + operands[i];
  line += ")";
  if (!attributes.empty()) line += " {" + attributes + "}";
  return line + " : (" + operand_types + ") -> " + result_type;
}

}  // namespace

Function::ConvDims Function::ConvDims::channels_first(int64_t spatial) {
  ConvDims dims;
  for (int64_t i = 0; i < spatial; ++i) {
    dims.input_spatial.push_back(2 + i);
    dims.kernel_spatial.push_back(2 + i);
    dims.output_spatial.push_back(2 + i);
  }
  return dims;
}

Value Function::convolution(const Value& lhs, const Value& rhs, const ConvDims& dims, const ConvWindow& window) {
  const char* op = "convolution";
  check_open(op);
  const size_t n = dims.input_spatial.size();
  STRATA_CHECK(rank(lhs) == static_cast<int64_t>(n + 2) && rank(rhs) == rank(lhs), ConfigError,
               "[stablehlo] convolution: ", n, " spatial dims need an input and a kernel of rank ", n + 2, ", got ",
               lhs.type.text(), " and ", rhs.type.text());
  STRATA_CHECK(lhs.type.dtype == rhs.type.dtype, ConfigError, "[stablehlo] convolution: input ", lhs.type.text(),
               " and kernel ", rhs.type.text(), " differ in element type");
  std::vector<int64_t> in_dims = dims.input_spatial, k_dims = dims.kernel_spatial, out_dims = dims.output_spatial;
  in_dims.insert(in_dims.end(), {dims.input_batch, dims.input_feature});
  k_dims.insert(k_dims.end(), {dims.kernel_output_feature, dims.kernel_input_feature});
  out_dims.insert(out_dims.end(), {dims.output_batch, dims.output_feature});
  check_dims(op, in_dims, n + 2);
  check_dims(op, k_dims, n + 2);
  check_dims(op, out_dims, n + 2);
  const std::vector<int64_t> strides = per_dim(op, "window_strides", window.strides, n, 1);
  const std::vector<int64_t> low = per_dim(op, "padding (low)", window.padding_low, n, 0);
  const std::vector<int64_t> high = per_dim(op, "padding (high)", window.padding_high, n, 0);
  const std::vector<int64_t> lhs_dilation = per_dim(op, "lhs_dilation", window.lhs_dilation, n, 1);
  const std::vector<int64_t> rhs_dilation = per_dim(op, "rhs_dilation", window.rhs_dilation, n, 1);
  check_positive(op, "window_strides", strides);
  check_positive(op, "lhs_dilation", lhs_dilation);
  check_positive(op, "rhs_dilation", rhs_dilation);
  const int64_t groups = window.feature_group_count, batch_groups = window.batch_group_count;
  STRATA_CHECK(groups >= 1 && batch_groups >= 1 && (groups == 1 || batch_groups == 1), ConfigError,
               "[stablehlo] convolution: feature_group_count ", groups, " and batch_group_count ", batch_groups,
               " must be positive, and one of them 1");
  auto size = [](const Value& v, int64_t d) { return v.type.dims[static_cast<size_t>(d)]; };
  const int64_t batch = size(lhs, dims.input_batch), features = size(lhs, dims.input_feature);
  const int64_t kernel_in = size(rhs, dims.kernel_input_feature), kernel_out = size(rhs, dims.kernel_output_feature);
  STRATA_CHECK(features % groups == 0 && features / groups == kernel_in, ConfigError,
               "[stablehlo] convolution: input features ", features, " in ", groups,
               " groups do not match the kernel's input features ", kernel_in);
  STRATA_CHECK(kernel_out % groups == 0 && kernel_out % batch_groups == 0 && batch % batch_groups == 0, ConfigError,
               "[stablehlo] convolution: kernel output features ", kernel_out, " and batch ", batch,
               " must divide into the groups (", groups, " feature, ", batch_groups, " batch)");
  Type result{lhs.type.dtype, std::vector<int64_t>(n + 2)};
  result.dims[static_cast<size_t>(dims.output_batch)] = batch / batch_groups;
  result.dims[static_cast<size_t>(dims.output_feature)] = kernel_out;
  for (size_t i = 0; i < n; ++i)
    result.dims[static_cast<size_t>(dims.output_spatial[i])] =
        windows(size(lhs, dims.input_spatial[i]), lhs_dilation[i], low[i], high[i], size(rhs, dims.kernel_spatial[i]),
                rhs_dilation[i], strides[i]);
  const std::string numbers =
      "#stablehlo.conv<raw input_batch_dimension = " + std::to_string(dims.input_batch) +
      ", input_feature_dimension = " + std::to_string(dims.input_feature) + ", input_spatial_dimensions = [" +
      join(dims.input_spatial) + "], kernel_input_feature_dimension = " + std::to_string(dims.kernel_input_feature) +
      ", kernel_output_feature_dimension = " + std::to_string(dims.kernel_output_feature) +
      ", kernel_spatial_dimensions = [" + join(dims.kernel_spatial) +
      "], output_batch_dimension = " + std::to_string(dims.output_batch) +
      ", output_feature_dimension = " + std::to_string(dims.output_feature) + ", output_spatial_dimensions = [" +
      join(dims.output_spatial) + "]>";
  return emit(op, {lhs, rhs}, "",
              "batch_group_count = " + std::to_string(batch_groups) + " : i64, dimension_numbers = " + numbers +
                  ", feature_group_count = " + std::to_string(groups) +
                  " : i64, lhs_dilation = " + array_attr(lhs_dilation) + ", padding = " + padding_attr(low, high) +
                  ", rhs_dilation = " + array_attr(rhs_dilation) + ", window_strides = " + array_attr(strides),
              result);
}

Value Function::reduce_window(const Value& x, const Value& init, const Window& window, ReduceOp op_kind) {
  const char* op = "reduce_window";
  check_open(op);
  STRATA_CHECK(init.type.dims.empty() && init.type.dtype == x.type.dtype, ConfigError,
               "[stablehlo] reduce_window: the initial value must be a ", tensor_type(x.type.dtype, {}), ", got ",
               init.type.text());
  const Window w = full_window(op, x, window);
  const std::string region = reduction_region(op_kind, x.type.dtype);
  return emit(op, {x, init}, region, window_attrs(w), {x.type.dtype, window_result_dims(x, w)});
}

std::vector<Value> Function::reduce_window_argmax(const Value& x, const Value& index, const Window& window) {
  const char* op = "reduce_window_argmax";
  check_open(op);
  STRATA_CHECK(is_floating(x.type.dtype), ConfigError, "[stablehlo] reduce_window_argmax: needs float values, got ",
               x.type.text());
  STRATA_CHECK(is_integer(index.type.dtype) && index.type.dims == x.type.dims, ConfigError,
               "[stablehlo] reduce_window_argmax: the indices must be integers of the values' dims ",
               shape_text(x.type.dims), ", got ", index.type.text());
  const Window w = full_window(op, x, window);
  const ElementType t = x.type.dtype, it = index.type.dtype;
  const Value init = constant({t, {}}, {-std::numeric_limits<double>::infinity()});
  const double largest = std::ldexp(1.0, static_cast<int>(element_size(it)) * 8 - 1) - 1;
  // 2^63 - 1 is not a double: the largest double below it.
  const Value no_index = constant({it, {}}, {it == ElementType::kS64 ? 9223372036854774784.0 : largest});

  // Note [Argmax windows]: as in argmax's region (stablehlo_ops.cpp), a
  // (value, index) pair wins when its value is larger, or is nan while the
  // other's is not; on equal values (or two nans) the smaller index wins,
  // so each window's result is its first maximum whatever order XLA
  // reduces in, as LibTorch's max pooling picks (strict >, scanning in
  // order). LibTorch keeps the last of several nans; this keeps the first.
  const std::string v = tensor_type(t, {}), i = tensor_type(it, {}), b = tensor_type(ElementType::kPred, {});
  const std::string a_v = fresh(), a_i = fresh(), b_v = fresh(), b_i = fresh();
  std::string body;
  auto cmp = [&](const std::string& l, const std::string& r, const char* dir, const std::string& type) {
    const std::string out = fresh();
    body += region_op(out, "compare", {l, r},
                      std::string("comparison_direction = #stablehlo<comparison_direction ") + dir + ">",
                      type + ", " + type, b);
    return out;
  };
  auto logic = [&](const char* name, const std::string& l, const std::string& r) {
    const std::string out = fresh();
    body += region_op(out, name, {l, r}, "", b + ", " + b, b);
    return out;
  };
  const std::string a_nan = cmp(a_v, a_v, "NE", v), b_nan = cmp(b_v, b_v, "NE", v);
  const std::string b_number = fresh();
  body += region_op(b_number, "not", {b_nan}, "", b, b);
  const std::string wins = logic("or", cmp(a_v, b_v, "GT", v), logic("and", a_nan, b_number));
  const std::string same = logic("or", cmp(a_v, b_v, "EQ", v), logic("and", a_nan, b_nan));
  const std::string pick = logic("or", wins, logic("and", same, cmp(a_i, b_i, "LT", i)));
  const std::string out_v = fresh(), out_i = fresh();
  body += region_op(out_v, "select", {pick, a_v, b_v}, "", b + ", " + v + ", " + v, v);
  body += region_op(out_i, "select", {pick, a_i, b_i}, "", b + ", " + i + ", " + i, i);
  const std::string region = "{\n    ^bb0(" + a_v + ": " + v + ", " + a_i + ": " + i + ", " + b_v + ": " + v + ", " +
                             b_i + ": " + i + "):" + body + "\n      \"stablehlo.return\"(" + out_v + ", " + out_i +
                             ") : (" + v + ", " + i + ") -> ()\n  }";
  const std::vector<int64_t> dims = window_result_dims(x, w);
  return emit_op("stablehlo.reduce_window", {x, index, init, no_index}, region, window_attrs(w),
                 {{t, dims}, {it, dims}});
}

Value Function::reverse(const Value& x, const std::vector<int64_t>& dims) {
  check_open("reverse");
  check_dims("reverse", dims, x.type.dims.size());
  return emit("reverse", {x}, "", "dimensions = " + array_attr(dims), x.type);
}

}  // namespace strata::xla::stablehlo
