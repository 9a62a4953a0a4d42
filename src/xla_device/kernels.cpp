// The aten kernels the xla device implements itself (allocation, views,
// copies between devices, resizing, .item()) and the boxed CPU fallback
// that runs every other op.
//
// Note [The CPU fallback]
// An op without a kernel here reaches fallback(): it is counted by name,
// reported once (or refused, under STRATA_XLA_FALLBACK=error), and run by
// LibTorch's at::native::cpu_fallback, which copies the xla inputs to the
// host (through _copy_from below), runs the CPU kernel, copies in-place and
// out= results back into their xla tensors (_copy_from_and_resize, which
// rebinds their storages) and uploads the other outputs. View ops must not
// get there, since a copy is not a view: those with device-specific kernels
// in LibTorch are registered here, the rest are composites over as_strided
// or alias, and a view op that still falls back is an error, not a silent
// copy (error_on_views).
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_copy_from_and_resize_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/xla/error.h"
#include "lazy_buffer.h"
#include "runtime.h"

namespace strata::xla::detail {
namespace {

constexpr c10::DeviceType kXla = c10::DeviceType::PrivateUse1;

bool is_xla(const at::Tensor& t) { return t.defined() && t.device().type() == kXla; }

c10::Device target_device(std::optional<c10::Device> device) {
  if (device && device->has_index()) return *device;
  return {kXla, current_device()};
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "[xla] only strided tensors live on the xla device, not ", *layout);
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_generic(size, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(at::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "[xla] only strided tensors live on the xla device, not ", *layout);
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_strided_generic(size, stride, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype.value_or(at::get_default_dtype_as_scalartype()));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

// A complex tensor's parts as a real tensor of one more dim, and back:
// LibTorch's kernels only change the dtype, sizes and strides over the
// same storage (Note [Complex tensors on the xla device] in lazy_buffer.h).
at::Tensor view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }

// A view of windows along a dim (repeat is made of it): LibTorch's kernel
// is as_strided arithmetic, device-independent.
at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_xla(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && (!memory_format || self.is_contiguous(*memory_format))) return self;
  impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != at::MemoryFormat::Contiguous) impl->empty_tensor_restride(*memory_format);
  const size_t needed =
      (static_cast<size_t>(self.storage_offset()) + static_cast<size_t>(self.numel())) * self.element_size();
  if (self.numel() > 0) grow_storage(*self.storage().unsafeGetStorageImpl(), needed);
  return self;
}

// A tensor made a view of `source` (DDP's gradients, views into their
// bucket): metadata only, the storage's value untouched.
at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "[xla] set_ of a tensor on ", self.device(),
              " to a storage on ", source.device(), "; both must be on the same device");
  TORCH_CHECK(stride.empty() || stride.size() == size.size(), "[xla] set_ got ", size.size(), " sizes and ",
              stride.size(), " strides");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  int64_t last = storage_offset;  // the furthest element the view reaches
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) return self;
    last += (size[d] - 1) * (stride.empty() ? self.stride(static_cast<int64_t>(d)) : stride[d]);
  }
  grow_storage(*self.storage().unsafeGetStorageImpl(), static_cast<size_t>(last + 1) * self.element_size());
  return self;
}

// Copies between the host and the device, and within the device: `self`
// is the source, `dst` the destination.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (is_xla(dst)) {
    if (is_xla(self) && lower_copy(self, dst)) return dst;
    write(dst, is_xla(self) ? host_view(self) : self);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "[xla] copies from the xla device go to the CPU, not to ", dst.device(),
                "; copy to the CPU first");
    dst.copy_(host_view(self));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (is_xla(dst)) {
      resize_xla(dst, self.sizes(), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return host_view(self).item(); }

// Module::to installs an xla tensor into a CPU parameter (and back) with
// set_data, which asks whether the two TensorImpls are interchangeable.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto interchangeable = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.device().is_cpu() || t.device().type() == kXla);
  };
  if (interchangeable(self) && interchangeable(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

enum class FallbackMode { kWarn, kError };

FallbackMode fallback_mode() {
  const char* value = std::getenv("STRATA_XLA_FALLBACK");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "warn") == 0) return FallbackMode::kWarn;
  if (std::strcmp(value, "error") == 0) return FallbackMode::kError;
  throw ConfigError(strata::detail::cat("[xla] STRATA_XLA_FALLBACK='", value,
                                        "' is not a mode; use 'warn' (the default) or 'error'"));
}

// A random op's missing (or xla) generator becomes the device's own
// (Note [Generators on the host] in runtime.cpp).
void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  c10::DeviceIndex index = -1;
  for (size_t i = 0; i < args.size() && index < 0; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (v.isTensor() && is_xla(v.toTensor())) index = v.toTensor().device().index();
  }
  for (size_t i = 0; i < args.size(); ++i) {
    c10::TypePtr type = args[i].real_type();
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (type->kind() != c10::TypeKind::GeneratorType) continue;
    c10::IValue& v = (*stack)[begin + i];
    if (v.isNone()) {
      v = c10::IValue(default_generator(index));
    } else if (v.isGenerator() && v.toGenerator().device().type() == kXla) {
      v = c10::IValue(default_generator(v.toGenerator().device().index()));
    }
  }
}

}  // namespace

void throw_other_device(const std::string& op, const at::Tensor& t) {
  throw XlaError(strata::detail::cat("[xla] ", op, " got a tensor on ", t.device(), " (shape ", t.sizes(),
                                     ") beside tensors on the xla device; move it there first "
                                     "(tensor.to(strata::xla::device())), or keep the op off the device"));
}

namespace {

// Mixing devices in one op is an error, as between cuda and cpu: the
// fallback would otherwise run it on the host without a word. 0-dim CPU
// tensors are scalars, and index tensors may live on the host (as with
// cuda).
void check_devices(const std::string& name, const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  if (name.find("index") != std::string::npos) return;
  const size_t n = schema.arguments().size();
  const at::Tensor* other = nullptr;
  bool xla = false;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1) xla = true;
    else if (t.dim() > 0 && other == nullptr) other = &t;
  };
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) visit(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec()) visit(t);
  }
  if (xla && other != nullptr) throw_other_device(name, *other);
}

}  // namespace

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = c10::toString(op.schema().operator_name());
  check_devices(name, op.schema(), *stack);
  if (fallback_mode() == FallbackMode::kError)
    throw XlaError(strata::detail::cat("[xla] ", name,
                                       " has no lowering for the xla device, and STRATA_XLA_FALLBACK=error forbids "
                                       "running it on the CPU; unset STRATA_XLA_FALLBACK to let it run there "
                                       "(slower), or keep the op off the device"));
  // Note [Ops with no CPU kernel]: LibTorch implements some ops for
  // accelerators only (CUDA's fused cells and their backwards, cuDNN's
  // ops); the CPU fallback would fail inside LibTorch with "Could not run
  // ... with arguments from the 'CPU' backend". Such an op is refused here,
  // by name, before anything is counted or synced.
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU))
    throw XlaError(strata::detail::cat("[xla] ", name,
                                       " has no lowering for the xla device, and LibTorch has no CPU kernel for it to "
                                       "fall back to (it is implemented for accelerators only); compute it from other "
                                       "ops, run it on the CPU with tensors moved there, or register a PrivateUse1 "
                                       "kernel for it"));
  if (count_fallback(name))
    log::warning("[xla] ", name,
                 " has no lowering for the xla device yet and runs on the CPU (inputs copied to the host, outputs "
                 "back): steps that use it are slower. strata::xla::metrics().fallbacks counts it; "
                 "STRATA_XLA_FALLBACK=error makes it an error");
  substitute_generators(op, stack);
  // The inputs are read on the host: the recorded step runs first, whole
  // (Note [One program per step] in recorder.cpp).
  sync_pending();
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

void register_kernels() {
  // Note [Registered at init, not at load] (runtime.cpp): these libraries
  // live for the rest of the process.
  static auto* kernels =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  kernels->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  kernels->impl("empty_strided", TORCH_FN(empty_strided));
  kernels->impl("as_strided", TORCH_FN(as_strided));
  kernels->impl("view", TORCH_FN(view));
  kernels->impl("unfold", TORCH_FN(unfold));
  kernels->impl("view_as_real", TORCH_FN(view_as_real));
  kernels->impl("view_as_complex", TORCH_FN(view_as_complex));
  kernels->impl("_reshape_alias", TORCH_FN(reshape_alias));
  kernels->impl("resize_", TORCH_FN(resize_xla));
  kernels->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  kernels->impl("_copy_from", TORCH_FN(copy_from));
  kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  kernels->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  static auto* fallbacks =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallbacks->fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  register_lowerings(*kernels);
}

}  // namespace strata::xla::detail
