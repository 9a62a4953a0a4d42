// LibTorch on the host side of the xla tests: tensors from catalogue
// inputs, and comparisons.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <string>

#include "strata/xla/client.h"
#include "xla/catalogue.h"

namespace strata::testing {

inline at::ScalarType scalar_type(ElementType type) {
  switch (type) {
    case ElementType::kPred:
      return at::kBool;
    case ElementType::kS8:
      return at::kChar;
    case ElementType::kS16:
      return at::kShort;
    case ElementType::kS32:
      return at::kInt;
    case ElementType::kS64:
      return at::kLong;
    case ElementType::kU8:
      return at::kByte;
    case ElementType::kU16:
      return at::kUInt16;
    case ElementType::kU32:
      return at::kUInt32;
    case ElementType::kU64:
      return at::kUInt64;
    case ElementType::kF16:
      return at::kHalf;
    case ElementType::kBF16:
      return at::kBFloat16;
    case ElementType::kF32:
      return at::kFloat;
    case ElementType::kF64:
      return at::kDouble;
    case ElementType::kC64:
      return at::kComplexFloat;
    case ElementType::kC128:
      return at::kComplexDouble;
  }
  return at::kFloat;
}

inline ElementType element_type_named(const std::string& name) {
  for (ElementType t : xla::all_element_types())
    if (xla::stablehlo_name(t) == name) return t;
  ADD_FAILURE() << "unknown element type " << name;
  return ElementType::kF32;
}

inline at::Tensor to_tensor(const HostTensor& h) {
  return at::tensor(h.values, at::kDouble).to(scalar_type(h.dtype)).reshape(h.dims);
}

/// A device buffer's value as a LibTorch tensor (dtype and shape from the
/// buffer itself).
inline at::Tensor to_tensor(const xla::Buffer& buffer) {
  std::vector<int64_t> dims = buffer.dims();
  at::Tensor out = at::empty(dims, at::TensorOptions().dtype(scalar_type(buffer.element_type())));
  buffer.to_host(out.data_ptr(), out.nbytes());
  return out;
}

/// Same dtype, same shape, values equal within float tolerance (exactly
/// equal for integers and bools).
/// A tensor from the oracle's JSON ({"dtype", "dims", "values"}; the
/// non-finite values come as "inf", "-inf", "nan": JSON has no such
/// numbers).
inline at::Tensor tensor_from_json(const nlohmann::json& j) {
  HostTensor h{element_type_named(j.at("dtype").get<std::string>()), j.at("dims").get<std::vector<int64_t>>(), {}};
  for (const nlohmann::json& v : j.at("values"))
    h.values.push_back(v.is_string() ? std::stod(v.get<std::string>()) : v.get<double>());
  return to_tensor(h);
}

inline void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (at::isFloatingType(want.scalar_type())) {
    const double rtol = want.scalar_type() == at::kBFloat16 ? 1e-2 : 2e-5;
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), want.to(at::kDouble), rtol, 1e-6, /*equal_nan=*/true))
        << what << "\ngot:\n"
        << got << "\nwant:\n"
        << want;
  } else {
    EXPECT_TRUE(at::equal(got, want)) << what << "\ngot:\n" << got << "\nwant:\n" << want;
  }
}

/// What LibTorch computes for each catalogue program: outputs[replica].
inline std::vector<std::vector<at::Tensor>> libtorch_reference(const CatalogueEntry& e) {
  std::vector<std::vector<at::Tensor>> in;
  for (const auto& replica : e.inputs) {
    in.emplace_back();
    for (const HostTensor& h : replica) in.back().push_back(to_tensor(h));
  }
  const auto& x = in[0];
  const std::string& n = e.name;
  if (n == "binary")
    return {{x[0] + x[1], x[0] - x[1], x[0] * x[1], x[0] / x[1], at::maximum(x[0], x[1]),
             at::minimum(x[0], x[1])}};
  if (n == "unary")
    return {{-x[0], at::exp(x[0]), at::log(x[1]), at::sqrt(x[1]), at::rsqrt(x[1]), at::tanh(x[0]),
             at::abs(x[0])}};
  if (n == "constant") {
    const double inf = std::numeric_limits<double>::infinity();
    return {{at::tensor(std::vector<double>{1.5, -0.25, 1e20, -inf, 0.0, 3.0}, at::kDouble)
                 .to(at::kFloat)
                 .reshape({2, 3}),
             x[0] + 0.5, at::tensor(std::vector<int32_t>{1, -2, 3, 2147483647}, at::kInt).reshape({2, 2}),
             at::tensor(std::vector<double>{1, 0, 1}, at::kDouble).to(at::kBool)}};
  }
  if (n == "dot_general") return {{at::bmm(x[0], x[1])}};
  if (n == "reduce") return {{x[0].sum(1), x[0].amax(at::IntArrayRef{0, 1})}};
  if (n == "broadcast_reshape_transpose")
    return {{x[0].unsqueeze(0).expand({2, 3}) + x[1], x[1].reshape({3, 2}), x[1].t().contiguous()}};
  if (n == "convert") return {{x[0].to(at::kInt), x[0].to(at::kBFloat16), x[0].to(at::kDouble)}};
  if (n == "compare_select") return {{x[0] > 0, at::relu(x[0])}};
  if (n == "softmax") return {{at::softmax(x[0], 1)}};
  if (n == "all_reduce") {
    const at::Tensor sum = in[0][0] + in[1][0];
    return {{sum}, {sum}};
  }
  if (n == "all_reduce_max_i32") {
    const at::Tensor max = at::maximum(in[0][0], in[1][0]);
    return {{max}, {max}};
  }
  if (n == "all_gather") {
    const at::Tensor all = at::cat({in[0][0], in[1][0]}, 0);
    return {{all}, {all}};
  }
  if (n == "reduce_scatter") {
    const at::Tensor sum = in[0][0] + in[1][0];
    return {{sum.slice(0, 0, 2)}, {sum.slice(0, 2, 4)}};
  }
  ADD_FAILURE() << "no LibTorch reference for " << n;
  return {};
}

}  // namespace strata::testing
