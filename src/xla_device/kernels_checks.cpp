// The lowered kernels of the checks a training step computes on the
// device, so that nothing is read inside the step (Note [No reads inside a
// lazy step] in strata/strategies/accelerator.h): isfinite, which gradient
// clipping's error_if_nonfinite defers to the step's end.
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite_ops.h>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

// isfinite is composite in LibTorch (comparisons and a product, none of
// them lowered); a kernel of its own records one is_finite node.
at::Tensor isfinite(const at::Tensor& self) {
  try {
    Recorder r("aten::isfinite");
    if (!at::isFloatingType(self.scalar_type())) throw NotLowered{};
    const NodePtr x = r.tensor(self);
    NodePtr value = r.op("is_finite", {x}, {ElementType::kPred, x->type().dims},
                         [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.is_finite(in[0]); });
    at::Tensor out = at::empty(self.sizes(), self.options().dtype(at::kBool));
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::isfinite>::call(self);
}

}  // namespace

void register_checks(torch::Library& library) { library.impl("isfinite", TORCH_FN(isfinite)); }

}  // namespace strata::xla::detail::lowering
