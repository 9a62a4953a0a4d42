// Autocast on the xla device (AutocastPrivateUse1): LibTorch registers
// autocast kernels for the CPU, CUDA, XPU and MPS only, and leaves an
// out-of-tree device's list to the device. Note [Autocast on xla as on the
// CPU]: the xla device takes the CPU's list (aten/src/ATen/autocast_mode.cpp,
// AutocastCPU) for the ops strata's models and losses reach, so bf16-mixed
// on xla casts exactly what bf16-mixed on the CPU casts, and a step on
// xla:0 can be checked against the same step on the CPU: the matrix
// products (mm, bmm, addmm, baddbmm, addbmm, linear, matmul) run in the
// autocast dtype, the losses in f32, and every other op in the dtype of
// its inputs (softmax, gelu and layer norm included, as on the CPU).
#include <ATen/autocast_mode.h>
#include <ATen/Operators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "lowering.h"

namespace strata::xla::detail::lowering {

void register_autocast() {
  // Note [Registered at init, not at load] (runtime.cpp): these libraries
  // live for the rest of the process.
  if (!c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::AutocastPrivateUse1)) {
    static auto* fallthrough =
        new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    fallthrough->fallback(torch::CppFunction::makeFallthrough());
  }
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  torch::Library& m = *library;
  // lower_precision_fp: run in the autocast dtype.
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linalg_vecdot, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_addmm_activation, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(prelu, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(scaled_dot_product_attention, lower_precision_fp)
  // fp32: the losses, as on the CPU.
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss2d, fp32)
  KERNEL_PRIVATEUSEONE(cross_entropy_loss, fp32)
  KERNEL_PRIVATEUSEONE(l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(smooth_l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(huber_loss, fp32)
  KERNEL_PRIVATEUSEONE(kl_div, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  KERNEL_PRIVATEUSEONE(cosine_embedding_loss, fp32)
  KERNEL_PRIVATEUSEONE(hinge_embedding_loss, fp32)
  KERNEL_PRIVATEUSEONE(poisson_nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(margin_ranking_loss, fp32)
  KERNEL_PRIVATEUSEONE(soft_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(multi_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(multilabel_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(triplet_margin_loss, fp32)
  KERNEL_PRIVATEUSEONE(prod, fp32)
  KERNEL_PRIVATEUSEONE(cdist, fp32)
  // promote: the widest input dtype, as on the CPU.
  KERNEL_PRIVATEUSEONE(stack, promote)
  KERNEL_PRIVATEUSEONE(cat, promote)
}

}  // namespace strata::xla::detail::lowering
