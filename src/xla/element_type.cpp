// ElementType's sizes and names in PJRT and StableHLO.
#include "strata/xla/element_type.h"

#include "pjrt_api.h"
#include "strata/xla/error.h"

namespace strata::xla {
namespace {

struct TypeInfo {
  ElementType type;
  size_t size;
  std::string_view stablehlo;
  int pjrt;
  bool floating;
};

// StableHLO integers are signless ("i32") except unsigned ones ("ui32");
// bool is "i1".
constexpr TypeInfo kTypes[] = {
    {ElementType::kPred, 1, "i1", PJRT_Buffer_Type_PRED, false},
    {ElementType::kS8, 1, "i8", PJRT_Buffer_Type_S8, false},
    {ElementType::kS16, 2, "i16", PJRT_Buffer_Type_S16, false},
    {ElementType::kS32, 4, "i32", PJRT_Buffer_Type_S32, false},
    {ElementType::kS64, 8, "i64", PJRT_Buffer_Type_S64, false},
    {ElementType::kU8, 1, "ui8", PJRT_Buffer_Type_U8, false},
    {ElementType::kU16, 2, "ui16", PJRT_Buffer_Type_U16, false},
    {ElementType::kU32, 4, "ui32", PJRT_Buffer_Type_U32, false},
    {ElementType::kU64, 8, "ui64", PJRT_Buffer_Type_U64, false},
    {ElementType::kF16, 2, "f16", PJRT_Buffer_Type_F16, true},
    {ElementType::kBF16, 2, "bf16", PJRT_Buffer_Type_BF16, true},
    {ElementType::kF32, 4, "f32", PJRT_Buffer_Type_F32, true},
    {ElementType::kF64, 8, "f64", PJRT_Buffer_Type_F64, true},
    {ElementType::kC64, 8, "complex<f32>", PJRT_Buffer_Type_C64, false},
    {ElementType::kC128, 16, "complex<f64>", PJRT_Buffer_Type_C128, false},
};

const TypeInfo& info(ElementType type) { return kTypes[static_cast<size_t>(type)]; }

}  // namespace

const std::vector<ElementType>& all_element_types() {
  static const std::vector<ElementType> types = [] {
    std::vector<ElementType> out;
    for (const TypeInfo& t : kTypes) out.push_back(t.type);
    return out;
  }();
  return types;
}

size_t element_size(ElementType type) { return info(type).size; }
std::string_view stablehlo_name(ElementType type) { return info(type).stablehlo; }
int pjrt_buffer_type(ElementType type) { return info(type).pjrt; }
bool is_floating(ElementType type) { return info(type).floating; }
bool is_complex(ElementType type) { return type == ElementType::kC64 || type == ElementType::kC128; }
ElementType complex_part(ElementType type) {
  if (type == ElementType::kC64) return ElementType::kF32;
  if (type == ElementType::kC128) return ElementType::kF64;
  return type;
}

ElementType from_pjrt_buffer_type(int type) {
  for (const TypeInfo& t : kTypes)
    if (t.pjrt == type) return t.type;
  throw XlaError(strata::detail::cat(
      "[pjrt] buffer element type ", type,
      " (PJRT_Buffer_Type) is not one strata handles (bool, integers, f16, bf16, f32, f64, complex)"));
}

std::string tensor_type(ElementType type, const std::vector<int64_t>& dims) {
  std::string out = "tensor<";
  for (int64_t d : dims) out += std::to_string(d) + "x";
  out += stablehlo_name(type);
  return out + ">";
}

}  // namespace strata::xla
