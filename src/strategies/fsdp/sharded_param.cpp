// ShardedParam: shard, unshard, and the storage of the full value.
#include "sharded_param.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include "first_use.h"
#include "strata/core/error.h"

namespace strata::strategies::detail {
namespace {

// Reaches the parameter dictionary a module keeps (protected in LibTorch).
struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& module) {
    return module.*(&ModuleAccess::parameters_);
  }
};

// A tensor over `of`'s storage that does not share its version counter,
// so writing through it does not invalidate what autograd saved.
at::Tensor alias_storage(const at::Tensor& of) {
  at::Tensor alias = at::empty({0}, of.options().requires_grad(false));
  alias.set_(of.storage(), of.storage_offset(), of.sizes(), of.strides());
  return alias;
}

// Note [Storage on any device]
// Frees (bytes == 0) or allocates again the storage that a full value and
// every view autograd saved of it share, on any device: the storage keeps
// its identity and takes new memory from its own allocator (the old bytes
// are not copied; the gather overwrites them). The allocator is the
// device's (LibTorch's caching allocator on CUDA), and a GPU allocator
// allocates on the *current* device, so the storage's own device is made
// current around the allocation (a device-generic guard: a no-op on the
// CPU). Freeing hands the block back to that allocator; on CUDA the caching
// allocator reuses it only for work queued after the free on the stream
// that allocated it (the compute stream), so kernels already queued that
// read the full value finish first. A collective on another stream that
// reads or writes this memory must record that stream on it (the process
// group's backend does so for its buffers). A freed storage keeps `tag`
// (Note [Gather on first use]).
void resize_storage(const c10::Storage& storage, size_t bytes, const std::shared_ptr<const FirstUseTag>& tag) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (bytes == 0) {
    impl->set_data_ptr_noswap(tagged_empty(tag, impl->device()));
  } else {
    c10::Allocator* allocator = impl->allocator();
    STRATA_CHECK(allocator != nullptr, Error, "[fsdp] the full value of a parameter on ", impl->device(),
                 " has a storage without an allocator, so it cannot be allocated again after forward");
    c10::OptionalDeviceGuard on_device;
    if (!impl->device().is_cpu()) on_device.reset_device(impl->device());
    c10::DataPtr data = allocator->allocate(bytes);
    STRATA_CHECK(data.device() == impl->device(), Error, "[fsdp] allocating the full value of a parameter on ",
                 impl->device(), " returned memory on ", data.device());
    impl->set_data_ptr_noswap(std::move(data));
  }
  impl->set_nbytes(bytes);
}

thread_local c10::Device setup_device{c10::kCPU};

}  // namespace

SetupDeviceScope::SetupDeviceScope(c10::Device device) : previous_(setup_device) { setup_device = device; }

SetupDeviceScope::~SetupDeviceScope() { setup_device = previous_; }

c10::Device SetupDeviceScope::current() { return setup_device; }

torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& module) {
  return ModuleAccess::parameters_of(module);
}

at::Tensor value_at_setup(const at::Tensor& t) {
  const c10::Device device = SetupDeviceScope::current();
  if (t.is_meta()) return at::zeros(t.sizes(), t.options().device(device).requires_grad(false));
  return t.detach().to(device);
}

void leave_meta(at::Tensor& t, c10::Device device) {
  if (t.is_meta()) t.unsafeGetTensorImpl()->_change_backend_component_keys(device);
}

GradAccumulator accumulator_then_empty(at::Tensor& compute, const at::Tensor& full, c10::ScalarType dtype,
                                       bool trainable) {
  GradAccumulator accumulator;
  leave_meta(compute, full.device());
  compute.mutable_grad() = at::Tensor();
  if (trainable) {
    compute.set_data(full.to(dtype));
    accumulator = torch::autograd::impl::grad_accumulator(compute);
  }
  compute.set_data(at::empty({0}, full.options().dtype(dtype).requires_grad(false)));
  return accumulator;
}

// Note [One block per unit]
// The full values of a unit's parameters live in one block of the unit's
// full size (world x its flat shard), parameter after parameter, each
// padded to world x chunk: the segmented layout of the unit's chunks
// (Note [Segmented layouts] in comm/backend.h), which the unit's
// all-gather writes in place. The gather and reduce buffers have the same
// size, so the buffer cache (Note [FSDP's buffer cache]) serves them from
// one size class, and freeing the unit after forward frees one block.
// Parameter p sits at world x p.offset.
void ShardedParam::unshard(const at::Tensor& unit_block, int world) {
  NoFirstUse internal;
  storage_bytes = static_cast<int64_t>(unit_block.storage().nbytes());
  compute.set_data(unit_block.narrow(0, world * offset, numel).view(shape));
  intercept(compute);
}

at::Tensor ShardedParam::reallocate_storage(int64_t numel) {
  const c10::Storage& storage = compute.storage();
  if (storage.nbytes() == 0) resize_storage(storage, storage_bytes, tag);
  STRATA_ASSERT(static_cast<int64_t>(storage.nbytes()) >= numel * compute.element_size(),
                "[fsdp] the storage of '", name, "' holds ", storage.nbytes(), " bytes, its unit's block needs ",
                numel * compute.element_size());
  at::Tensor block = alias_storage(compute);
  block.set_(storage, 0, {numel}, {1});
  return block;
}

void ShardedParam::free_storage() { resize_storage(compute.storage(), 0, tag); }

// The full shape over a storage of its own that holds 0 bytes and the tag
// (Note [Gather on first use]); not resizable: a gather makes a new block.
void ShardedParam::reshard(c10::ScalarType dtype) {
  NoFirstUse internal;
  at::Tensor placeholder = at::empty({0}, shard.options().dtype(dtype).requires_grad(false));
  c10::TensorImpl* impl = placeholder.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(c10::Storage(c10::Storage::use_byte_size_t(), 0, tagged_empty(tag, shard.device()),
                                            shard.storage().allocator(), /*resizable=*/false));
  impl->set_sizes_contiguous(shape);
  compute.set_data(placeholder);
  intercept(compute);
}

void ShardedParam::install_shard() {
  for (auto& [owner, local_name] : owners) parameters_of(*owner)[local_name] = shard;
}

}  // namespace strata::strategies::detail
