// The element types strata moves between host and XLA devices, with their
// PJRT and StableHLO names. No LibTorch: the CLI maps at::ScalarType onto
// these itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::xla {

/// strata's tensor dtypes (bool, signed and unsigned integers, f16, bf16,
/// f32, f64, and the complex pairs of f32 and f64).
enum class ElementType { kPred, kS8, kS16, kS32, kS64, kU8, kU16, kU32, kU64, kF16, kBF16, kF32, kF64, kC64, kC128 };

/// Every ElementType, in declaration order.
const std::vector<ElementType>& all_element_types();

/// Bytes per element on the host (bool: 1).
size_t element_size(ElementType type);

/// The StableHLO element type: "i1", "i8", ..., "ui8", "f16", "bf16", "f32",
/// "complex<f32>".
std::string_view stablehlo_name(ElementType type);

/// PJRT_Buffer_Type's value for `type`.
int pjrt_buffer_type(ElementType type);

/// The ElementType of a PJRT_Buffer_Type value; throws XlaError for types
/// strata does not handle (fp8, 4-bit, tokens).
ElementType from_pjrt_buffer_type(int type);

/// f16, bf16, f32, f64 (not the complex types).
bool is_floating(ElementType type);

/// complex<f32>, complex<f64>.
bool is_complex(ElementType type);

/// The type of a complex type's parts (f32 for complex<f32>); `type` itself
/// for any other.
ElementType complex_part(ElementType type);

/// "tensor<2x3xf32>" for dims {2, 3}; "tensor<f32>" for a scalar.
std::string tensor_type(ElementType type, const std::vector<int64_t>& dims);

}  // namespace strata::xla
