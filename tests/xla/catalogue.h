// The StableHLO programs the xla tests emit: each built with strata's
// builder, with its inputs. stablehlo_test.cpp checks their text against
// tests/xla/golden/; oracle_test.cpp runs every one on JAX's CPU backend
// and on the CPU PJRT plugin and compares with LibTorch.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "strata/xla/stablehlo.h"

namespace strata::testing {

using xla::ElementType;
using xla::stablehlo::Direction;
using xla::stablehlo::Function;
using xla::stablehlo::Module;
using xla::stablehlo::ReduceOp;
using xla::stablehlo::Type;
using xla::stablehlo::Value;

/// Host values of one argument.
struct HostTensor {
  ElementType dtype = ElementType::kF32;
  std::vector<int64_t> dims;
  std::vector<double> values;
};

struct CatalogueEntry {
  std::string name;
  std::string module;
  int replicas = 1;
  std::vector<std::vector<HostTensor>> inputs;  ///< [replica][argument]
};

/// n values spread over [lo, hi], deterministic and irregular.
inline std::vector<double> spread(int64_t n, double lo, double hi, int salt = 0) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i * 7 + salt * 3) % (n > 1 ? n : 1);
    // Quarter steps: exact in every float type the tests use.
    v.push_back(std::round((lo + (hi - lo) * double(k) / double(n > 1 ? n - 1 : 1)) * 4.0) / 4.0);
  }
  return v;
}

inline HostTensor f32(std::vector<int64_t> dims, double lo, double hi, int salt = 0) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return {ElementType::kF32, std::move(dims), spread(n, lo, hi, salt)};
}

inline std::vector<CatalogueEntry> catalogue() {
  std::vector<CatalogueEntry> out;
  auto add = [&out](std::string name, const Function& f, int replicas,
                    std::vector<std::vector<HostTensor>> inputs) {
    Module m(name, replicas);
    m.add(f);
    out.push_back({std::move(name), m.text(), replicas, std::move(inputs)});
  };
  const Type m23{ElementType::kF32, {2, 3}};
  {
    Function f("main", {m23, m23});
    const Value a = f.arg(0), b = f.arg(1);
    f.returns(
        {f.add(a, b), f.subtract(a, b), f.multiply(a, b), f.divide(a, b), f.maximum(a, b), f.minimum(a, b)});
    add("binary", f, 1, {{f32({2, 3}, -3, 2), f32({2, 3}, 0.25, 4, 1)}});
  }
  {
    Function f("main", {m23, m23});
    const Value a = f.arg(0), p = f.arg(1);  // p > 0
    f.returns({f.negate(a), f.exponential(a), f.log(p), f.sqrt(p), f.rsqrt(p), f.tanh(a), f.abs(a)});
    add("unary", f, 1, {{f32({2, 3}, -2, 2), f32({2, 3}, 0.25, 9, 2)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {3}}});
    const double inf = std::numeric_limits<double>::infinity();
    const Value c = f.constant(Type{ElementType::kF32, {2, 3}}, {1.5, -0.25, 1e20, -inf, 0.0, 3.0});
    const Value splat = f.constant(Type{ElementType::kF32, {3}}, {0.5});
    const Value ints = f.constant(Type{ElementType::kS32, {2, 2}}, {1, -2, 3, 2147483647});
    const Value flags = f.constant(Type{ElementType::kPred, {3}}, {1, 0, 1});
    f.returns({c, f.add(f.arg(0), splat), ints, flags});
    add("constant", f, 1, {{f32({3}, -1, 1)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {2, 3, 4}}, Type{ElementType::kF32, {2, 4, 5}}});
    f.returns({f.dot_general(f.arg(0), f.arg(1), {{0}, {0}, {2}, {1}})});
    add("dot_general", f, 1, {{f32({2, 3, 4}, -1, 1), f32({2, 4, 5}, -2, 1.5, 3)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {3, 4}}});
    const Value zero = f.constant(Type{ElementType::kF32, {}}, {0.0});
    const Value lowest = f.constant(Type{ElementType::kF32, {}}, {-std::numeric_limits<double>::infinity()});
    f.returns(
        {f.reduce(f.arg(0), zero, {1}, ReduceOp::kSum), f.reduce(f.arg(0), lowest, {0, 1}, ReduceOp::kMax)});
    add("reduce", f, 1, {{f32({3, 4}, -5, 5)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {3}}, m23});
    const Value row = f.broadcast_in_dim(f.arg(0), {2, 3}, {1});
    f.returns({f.add(row, f.arg(1)), f.reshape(f.arg(1), {3, 2}), f.transpose(f.arg(1), {1, 0})});
    add("broadcast_reshape_transpose", f, 1, {{f32({3}, -1, 1), f32({2, 3}, 0, 5, 1)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {6}}});
    f.returns({f.convert(f.arg(0), ElementType::kS32), f.convert(f.arg(0), ElementType::kBF16),
               f.convert(f.arg(0), ElementType::kF64)});
    add("convert", f, 1, {{f32({6}, -7.75, 7.75)}});
  }
  {
    Function f("main", {m23});
    const Value zeros = f.constant(m23, {0.0});
    const Value positive = f.compare(f.arg(0), zeros, Direction::kGT);
    f.returns({positive, f.select(positive, f.arg(0), zeros)});
    add("compare_select", f, 1, {{f32({2, 3}, -2, 3)}});
  }
  {
    // softmax over the last dim, from reductions and broadcasts: the shape
    // of what layer norm and attention lower to.
    const Type x{ElementType::kF32, {2, 5}};
    Function f("main", {x});
    const Value lowest = f.constant(Type{ElementType::kF32, {}}, {-std::numeric_limits<double>::infinity()});
    const Value zero = f.constant(Type{ElementType::kF32, {}}, {0.0});
    const Value max = f.broadcast_in_dim(f.reduce(f.arg(0), lowest, {1}, ReduceOp::kMax), {2, 5}, {0});
    const Value e = f.exponential(f.subtract(f.arg(0), max));
    const Value sum = f.broadcast_in_dim(f.reduce(e, zero, {1}, ReduceOp::kSum), {2, 5}, {0});
    f.returns({f.divide(e, sum)});
    add("softmax", f, 1, {{f32({2, 5}, -3, 4)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {4}}});
    f.returns({f.all_reduce(f.arg(0), ReduceOp::kSum, {{0, 1}})});
    add("all_reduce", f, 2, {{f32({4}, -1, 2)}, {f32({4}, 3, 6, 1)}});
  }
  {
    Function f("main", {Type{ElementType::kS32, {3}}});
    f.returns({f.all_reduce(f.arg(0), ReduceOp::kMax, {{0, 1}})});
    add("all_reduce_max_i32", f, 2,
        {{{ElementType::kS32, {3}, {5, -7, 2}}}, {{ElementType::kS32, {3}, {-1, 4, 2}}}});
  }
  {
    Function f("main", {m23});
    f.returns({f.all_gather(f.arg(0), 0, {{0, 1}})});
    add("all_gather", f, 2, {{f32({2, 3}, 0, 5)}, {f32({2, 3}, -5, 0, 1)}});
  }
  {
    Function f("main", {Type{ElementType::kF32, {4, 2}}});
    f.returns({f.reduce_scatter(f.arg(0), 0, ReduceOp::kSum, {{0, 1}})});
    add("reduce_scatter", f, 2, {{f32({4, 2}, -2, 2)}, {f32({4, 2}, 1, 3, 2)}});
  }
  return out;
}

}  // namespace strata::testing
