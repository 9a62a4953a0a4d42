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
  Value unary(const char* op, const Value& a);
  Value emit(const std::string& op, const std::vector<Value>& operands, const std::string& region,
             const std::string& attributes, const Type& result);
  std::string reduction_region(ReduceOp op, ElementType dtype);
  std::string fresh();
  void check_open(const char* op) const;

  std::string name_;
  std::vector<Value> args_;
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
