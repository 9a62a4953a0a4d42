// A StableHLO text builder: functions made of the ops a captured training
// step needs, printed as MLIR text that PJRT's "mlir" program format
// accepts (docs/xla.md, "StableHLO text").
//
// Every op is printed in MLIR's generic form ("stablehlo.add"(...) : (...)
// -> ...), the plainest spelling and the one least tied to a parser
// version. Values are numbered in creation order, attributes in a fixed
// order, so the same calls always print the same text (the golden tests in
// tests/xla/stablehlo_test.cpp rely on it). Each op checks its operands'
// types and throws ConfigError naming the op; result types are inferred.
// No LibTorch and no MLIR are involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/xla/element_type.h"

namespace strata::xla::stablehlo {

/// A ranked tensor type.
struct Type {
  ElementType dtype = ElementType::kF32;
  std::vector<int64_t> dims;

  /// "tensor<2x3xf32>".
  std::string text() const { return tensor_type(dtype, dims); }
  int64_t numel() const;
  bool operator==(const Type& other) const { return dtype == other.dtype && dims == other.dims; }
};

/// An SSA value of a function being built.
struct Value {
  std::string name;  ///< "%arg0", "%3"
  Type type;
};

enum class ReduceOp { kSum, kProduct, kMax, kMin };
enum class Direction { kEQ, kNE, kLT, kLE, kGT, kGE };
/// Replica ids per group, e.g. {{0, 1}}: every group the same size.
using ReplicaGroups = std::vector<std::vector<int64_t>>;

/// dot_general's dimension numbers.
struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

/// gather's dimension numbers (StableHLO's GatherDimensionNumbers). Empty
/// lists are left out of the printed attribute.
struct GatherDims {
  std::vector<int64_t> offset_dims;           ///< result dims that hold the slice's kept dims
  std::vector<int64_t> collapsed_slice_dims;  ///< operand dims of slice size 1 dropped from the result
  std::vector<int64_t> operand_batching_dims;
  std::vector<int64_t> start_indices_batching_dims;
  std::vector<int64_t> start_index_map;  ///< operand dim each index vector entry indexes
  int64_t index_vector_dim = 0;          ///< == rank of the indices: an implicit trailing 1
};

/// scatter's dimension numbers (StableHLO's ScatterDimensionNumbers).
struct ScatterDims {
  std::vector<int64_t> update_window_dims;    ///< updates dims that hold the window
  std::vector<int64_t> inserted_window_dims;  ///< operand dims of window size 1, absent from updates
  std::vector<int64_t> input_batching_dims;
  std::vector<int64_t> scatter_indices_batching_dims;
  std::vector<int64_t> scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
};

/// fft's kind (StableHLO's FFT, IFFT, RFFT, IRFFT).
enum class FftType { kForward, kInverse, kRealForward, kRealInverse };

/// rng_bit_generator's algorithm; THREE_FRY and PHILOX take a
/// tensor<2xui64> state (key, counter) and print the same bits everywhere.
enum class RngAlgorithm { kDefault, kThreeFry, kPhilox };

/// One function (`func.func public @name`) under construction.
class Function {
 public:
  Function(std::string name, std::vector<Type> params);

  const Value& arg(size_t i) const;
  size_t num_args() const { return args_.size(); }

  /// A constant of `type`: one value (a splat) or numel() values, row-major.
  Value constant(const Type& type, const std::vector<double>& values);

  // Element-wise, same types in and out.
  Value add(const Value& a, const Value& b) { return binary("add", a, b); }
  Value subtract(const Value& a, const Value& b) { return binary("subtract", a, b); }
  Value multiply(const Value& a, const Value& b) { return binary("multiply", a, b); }
  Value divide(const Value& a, const Value& b) { return binary("divide", a, b); }
  Value maximum(const Value& a, const Value& b) { return binary("maximum", a, b); }
  Value minimum(const Value& a, const Value& b) { return binary("minimum", a, b); }
  Value negate(const Value& a) { return unary("negate", a); }
  Value exponential(const Value& a) { return unary("exponential", a); }
  Value log(const Value& a) { return unary("log", a); }
  Value sqrt(const Value& a) { return unary("sqrt", a); }
  Value rsqrt(const Value& a) { return unary("rsqrt", a); }
  Value tanh(const Value& a) { return unary("tanh", a); }
  Value abs(const Value& a) { return unary("abs", a); }

  // More element-wise ops (stablehlo_ops.cpp). Float-only ops throw
  // ConfigError for other element types. The logical_* ops are StableHLO's
  // and/or/xor/not: logical on bool, bitwise on integers. remainder is C's
  // fmod (the sign of the dividend, torch.fmod); sign takes signed integers
  // and floats; round_nearest_even rounds halves to even (torch.round).
  Value power(const Value& a, const Value& b) { return binary("power", a, b); }
  Value remainder(const Value& a, const Value& b) { return binary("remainder", a, b); }
  Value logical_and(const Value& a, const Value& b) { return bitwise("and", a, b); }
  Value logical_or(const Value& a, const Value& b) { return bitwise("or", a, b); }
  Value logical_xor(const Value& a, const Value& b) { return bitwise("xor", a, b); }
  Value logical_not(const Value& a);
  Value shift_right_logical(const Value& a, const Value& b) { return bitwise("shift_right_logical", a, b); }
  Value shift_left(const Value& a, const Value& b) { return bitwise("shift_left", a, b); }
  Value sign(const Value& a);
  Value floor(const Value& a) { return float_unary("floor", a); }
  Value ceil(const Value& a) { return float_unary("ceil", a); }
  Value round_nearest_even(const Value& a) { return float_unary("round_nearest_even", a); }
  Value logistic(const Value& a) { return float_unary("logistic", a); }
  Value log_plus_one(const Value& a) { return float_unary("log_plus_one", a); }
  Value exponential_minus_one(const Value& a) { return float_unary("exponential_minus_one", a); }
  Value sine(const Value& a) { return float_unary("sine", a); }
  Value cosine(const Value& a) { return float_unary("cosine", a); }
  Value tan(const Value& a) { return float_unary("tan", a); }
  Value atan2(const Value& a, const Value& b) { return binary("atan2", a, b); }
  /// The Gauss error function, as `chlo.erf` (CHLO, which XLA's MLIR path
  /// lowers; StableHLO's core opset has no erf). Float types only.
  Value erf(const Value& a) { return chlo_unary("erf", a); }
  /// The inverse and hyperbolic trigonometric functions, as CHLO's ops
  /// (Note [chlo.erf]). Float types only.
  Value acos(const Value& a) { return chlo_unary("acos", a); }
  Value asin(const Value& a) { return chlo_unary("asin", a); }
  Value atan(const Value& a) { return chlo_unary("atan", a); }
  Value acosh(const Value& a) { return chlo_unary("acosh", a); }
  Value asinh(const Value& a) { return chlo_unary("asinh", a); }
  Value atanh(const Value& a) { return chlo_unary("atanh", a); }
  Value cosh(const Value& a) { return chlo_unary("cosh", a); }
  Value sinh(const Value& a) { return chlo_unary("sinh", a); }
  /// True where `a` is neither infinite nor nan (float types only).
  Value is_finite(const Value& a);
  /// min(max(x, lo), hi); `lo` and `hi` are scalars or of x's type.
  Value clamp(const Value& lo, const Value& x, const Value& hi);
  /// Reinterprets the bits of `x` as `dtype` (same element size).
  Value bitcast_convert(const Value& x, ElementType dtype);
  /// The complex numbers re + i im (f32 parts give complex<f32>).
  Value complex(const Value& re, const Value& im);
  /// The real and imaginary parts of a complex `x`.
  Value real(const Value& x) { return complex_part_of("real", x); }
  Value imag(const Value& x) { return complex_part_of("imag", x); }
  /// The discrete Fourier transform over the innermost `lengths.size()`
  /// (1 to 3) dims of `x`, XLA's: kForward and kInverse map complex to
  /// complex, kInverse divided by the points' count; kRealForward maps
  /// reals to the n / 2 + 1 non-negative frequencies of the last dim;
  /// kRealInverse maps those back to `lengths.back()` reals, divided by
  /// the count.
  Value fft(const Value& x, FftType type, const std::vector<int64_t>& lengths);

  /// Batched, contracted product: result dims are the batch dims, then
  /// lhs's free dims, then rhs's free dims.
  Value dot_general(const Value& lhs, const Value& rhs, const DotDims& dims);
  /// Reduces `x` over `dims` with `op`, starting from the scalar `init`.
  Value reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims, ReduceOp op);
  /// Broadcasts `x` to `dims`; operand dim i becomes result dim
  /// `broadcast_dims[i]`.
  Value broadcast_in_dim(const Value& x, const std::vector<int64_t>& dims,
                         const std::vector<int64_t>& broadcast_dims);
  Value reshape(const Value& x, const std::vector<int64_t>& dims);
  Value transpose(const Value& x, const std::vector<int64_t>& permutation);
  Value convert(const Value& x, ElementType dtype);
  /// Element-wise comparison; the result is bool (i1).
  Value compare(const Value& a, const Value& b, Direction direction);
  Value select(const Value& pred, const Value& on_true, const Value& on_false);

  // Shapes and indexing (stablehlo_ops.cpp).
  /// 0, 1, 2, ... along `dim` of `type`, repeated along the other dims.
  Value iota(const Type& type, int64_t dim);
  /// x[start:limit:stride] per dim; `strides` empty means all 1.
  Value slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides = {});
  /// Joins same-typed values (equal but for `dim`) along `dim`.
  Value concatenate(const std::vector<Value>& values, int64_t dim);
  /// Pads `x` with the scalar `value`: `low`/`high` elements before and
  /// after each dim (negative ones cut), `interior` between elements.
  Value pad(const Value& x, const Value& value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
  // Sort (stablehlo_sort.cpp).
  /// `values` (of one shape) sorted along `dim` by the first of them,
  /// ascending (descending), stably, NaN after every number ascending and
  /// before it descending (torch.sort's order); the others travel with
  /// their keys. Returns them all, in order.
  std::vector<Value> sort(const std::vector<Value>& values, int64_t dim, bool descending);
  /// A `sizes` slice of `x` at the integer scalars `start` (one per dim,
  /// clamped by XLA so the slice stays inside `x`).
  Value dynamic_slice(const Value& x, const std::vector<Value>& start, const std::vector<int64_t>& sizes);
  /// `x` with `update` written at the integer scalars `start` (clamped).
  Value dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& start);

  // Gather and scatter (stablehlo_gather.cpp).
  /// StableHLO's gather of `slice_sizes` slices of `operand` at integer
  /// `indices`; the result shape is inferred from `dims`.
  Value gather(const Value& operand, const Value& indices, const GatherDims& dims,
               const std::vector<int64_t>& slice_sizes, bool indices_are_sorted = false);
  /// index_select / embedding lookup: the slices of `table` at `indices`
  /// (integers of any shape) along `dim`. The result's dims are table's
  /// before `dim`, then the indices', then table's after `dim` (jnp.take).
  /// Out-of-range indices are clamped, as XLA's gather does.
  Value take_rows(const Value& table, const Value& indices, int64_t dim = 0);
  /// StableHLO's scatter: `operand` with each window of `updates` combined
  /// into it by `op` at `indices`; the result has operand's type.
  Value scatter(const Value& operand, const Value& indices, const Value& updates, const ScatterDims& dims,
                ReduceOp op = ReduceOp::kSum, bool indices_are_sorted = false, bool unique_indices = false);
  /// scatter whose update replaces the operand's element (torch.scatter,
  /// index_put_): with repeated indices XLA keeps one of the updates,
  /// which one unspecified, as LibTorch leaves it undefined.
  Value scatter_replace(const Value& operand, const Value& indices, const Value& updates, const ScatterDims& dims);
  /// take_rows' adjoint (embedding backward): `table` plus each slice of
  /// `updates` added at its index along `dim`; `updates` has take_rows'
  /// result shape for `indices`. Repeated indices accumulate.
  Value scatter_add_rows(const Value& table, const Value& indices, const Value& updates, int64_t dim = 0);

  // Windows (stablehlo_window.cpp): convolution, reduce_window, reverse.
  /// Which dims of a convolution's input, kernel and output hold the
  /// batch, the features and the spatial dims, in the spatial dims' order
  /// (StableHLO's ConvDimensionNumbers).
  struct ConvDims {
    int64_t input_batch = 0, input_feature = 1;
    std::vector<int64_t> input_spatial;
    int64_t kernel_output_feature = 0, kernel_input_feature = 1;
    std::vector<int64_t> kernel_spatial;
    int64_t output_batch = 0, output_feature = 1;
    std::vector<int64_t> output_spatial;
    /// PyTorch's layout with `spatial` spatial dims: input [N, C, ...],
    /// kernel [O, I, ...], output [N, C, ...].
    static ConvDims channels_first(int64_t spatial);
  };
  /// A convolution's window, one entry per spatial dim; an empty list means
  /// all 1 (strides, dilations) or all 0 (padding). Padding may be
  /// negative (it then cuts).
  struct ConvWindow {
    std::vector<int64_t> strides, padding_low, padding_high, lhs_dilation, rhs_dilation;
    int64_t feature_group_count = 1, batch_group_count = 1;
  };
  /// StableHLO's convolution of `lhs` by the kernel `rhs` (same element
  /// type); the result's shape is inferred as the spec does. Throws
  /// ConfigError naming what does not fit.
  Value convolution(const Value& lhs, const Value& rhs, const ConvDims& dims, const ConvWindow& window);
  /// reduce_window's window, one entry per dim of the operand; an empty
  /// list means all 1 (dimensions, strides, dilations) or all 0 (padding).
  struct Window {
    std::vector<int64_t> dimensions, strides, base_dilations, window_dilations, padding_low, padding_high;
  };
  /// Reduces each window of `x` with `op` from the scalar `init` (the
  /// padding holds `init`).
  Value reduce_window(const Value& x, const Value& init, const Window& window, ReduceOp op);
  /// {max, its index} over each window of the pair (`x`, `index`), one
  /// variadic reduce_window: the larger value wins, nan above all, and on
  /// equal values (or two nans) the smaller index. The padding holds
  /// (-inf, the index type's largest value), so it never wins over an
  /// element of `x`. `x` is float, `index` integer, of x's dims.
  std::vector<Value> reduce_window_argmax(const Value& x, const Value& index, const Window& window);
  /// `x` with the order of its elements reversed along each of `dims`.
  Value reverse(const Value& x, const std::vector<int64_t>& dims);

  // Several results (stablehlo_ops.cpp).
  /// Passes `values` through unchanged; XLA moves no computation across it.
  std::vector<Value> optimization_barrier(const std::vector<Value>& values);
  /// {new state, random bits of `type`} from a tensor<2xui64> `state`
  /// (for THREE_FRY and PHILOX): the same state gives the same bits.
  std::vector<Value> rng_bit_generator(const Value& state, const Type& type,
                                       RngAlgorithm algorithm = RngAlgorithm::kThreeFry);
  /// {new state, f32 values uniform in [0, 1) of shape `dims`} from
  /// THREE_FRY bits: the top 23 bits as the mantissa of a float in [1, 2),
  /// minus 1 (what jax.random.uniform does).
  std::vector<Value> uniform(const Value& state, const std::vector<int64_t>& dims);
  /// {max, index of the first max} of `x` along `dim` (nan counts as the
  /// largest, as in torch.max); the index has `index_dtype`.
  std::vector<Value> argmax(const Value& x, int64_t dim, ElementType index_dtype = ElementType::kS64);

  /// Donation: argument `arg`'s buffer may be reused for result `output`
  /// (`tf.aliasing_output`; the types must match), or, with output = -1,
  /// for any result XLA chooses (`jax.buffer_donor`). The caller's buffer
  /// is consumed by the execution.
  void donate(size_t arg, int64_t output = -1);

  // Cross-replica collectives (compile with num_replicas = group size).
  Value all_reduce(const Value& x, ReduceOp op, const ReplicaGroups& groups);
  Value all_gather(const Value& x, int64_t dim, const ReplicaGroups& groups);
  Value reduce_scatter(const Value& x, int64_t dim, ReduceOp op, const ReplicaGroups& groups);

  /// Ends the function; must be called exactly once, last.
  void returns(const std::vector<Value>& results);

  /// The function's text (two-space indented, one op per line).
  std::string text() const;

 private:
  Value binary(const char* op, const Value& a, const Value& b);
  Value chlo_unary(const char* op, const Value& a);
  Value unary(const char* op, const Value& a);
  Value float_unary(const char* op, const Value& a);
  Value bitwise(const char* op, const Value& a, const Value& b);
  Value complex_part_of(const char* op, const Value& x);
  Value emit(const std::string& op, const std::vector<Value>& operands, const std::string& region,
             const std::string& attributes, const Type& result);
  /// `op` with a dialect prefix ("stablehlo.add", "chlo.erf") and any
  /// number of results, named %N#i when there are several.
  std::vector<Value> emit_op(const std::string& op, const std::vector<Value>& operands,
                             const std::string& region, const std::string& attributes,
                             const std::vector<Type>& results);
  std::string reduction_region(ReduceOp op, ElementType dtype);
  /// The region of a scatter that keeps the update.
  std::string replace_region(ElementType dtype);
  Value scatter_with_region(const Value& operand, const Value& indices, const Value& updates, const ScatterDims& dims,
                            const std::string& region, bool indices_are_sorted, bool unique_indices);
  std::string fresh();
  void check_open(const char* op) const;

  std::string name_;
  std::vector<Value> args_;
  std::vector<int64_t> donated_;  ///< per argument: -2 none, -1 buffer donor, else the aliased output
  std::vector<std::string> lines_;
  std::vector<Type> results_;
  int next_ = 0;
  bool closed_ = false;
};

/// A module holding functions; the entry function is named "main".
class Module {
 public:
  explicit Module(std::string name, int64_t num_replicas = 1, int64_t num_partitions = 1);
  void add(const Function& function);
  /// The module's text, ending in a newline.
  std::string text() const;

 private:
  std::string name_;
  int64_t num_replicas_, num_partitions_;
  std::vector<std::string> functions_;
};

/// "dense<[[0, 1]]> : tensor<1x2xi64>"; throws ConfigError for empty or
/// ragged groups.
std::string replica_groups_attribute(const ReplicaGroups& groups);

/// The literal for `value` as an element of `dtype` in a dense attribute:
/// "1.5", "2.0e+20", "0x7F800000" (inf, nan), "-3", "true".
std::string element_literal(double value, ElementType dtype);

}  // namespace strata::xla::stablehlo
