// FSDP's cache of large host buffers (Note [FSDP's buffer cache]). Private
// to the strategies area.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace strata::strategies::detail {

/// An allocator for the buffers an FSDP unit needs again every step (its
/// gathered parameters, its gradient block, the reduce-scatter's output):
/// blocks of at least kMinBytes are mapped from the kernel on their own
/// (huge pages where the kernel offers them), and a freed one waits, by its
/// exact size, for the next request of that size. Idle blocks beyond
/// kWarmBlocks of the largest size give their pages back to the kernel
/// and keep their mapping (Note [FSDP's buffer cache]). Smaller requests go
/// to LibTorch's CPU allocator. Thread-safe: buffers are freed on the
/// communication threads too.
class BufferCache final : public c10::Allocator {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  /// Idle blocks keep their pages up to this many of the largest block.
  static constexpr size_t kWarmBlocks = 2;

  /// The process's cache for host memory; never destroyed, since tensors
  /// that hold its blocks may outlive any one strategy.
  static BufferCache& host();

  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  /// An uninitialised contiguous CPU tensor whose storage comes from this
  /// cache (so its storage, resized to zero and back, keeps using it).
  at::Tensor empty(at::IntArrayRef sizes, c10::ScalarType dtype);

  /// Frees every idle block (blocks in use come back to the cache when
  /// their tensors are freed).
  void release();

  /// Bytes of the idle blocks that keep their pages (resident memory
  /// waiting for a request).
  size_t idle_bytes() const;
  /// Bytes of the blocks in use and of the idle ones that keep their pages.
  size_t held_bytes() const;

 private:
  struct Block;
  static void give_back(void* block);

  mutable std::mutex mutex_;
  /// Idle blocks by size; the ones keeping their pages last, taken first.
  std::unordered_map<size_t, std::vector<Block*>> idle_;
  size_t idle_bytes_ = 0;  ///< of idle blocks that keep their pages
  size_t held_bytes_ = 0;  ///< in use, plus idle_bytes_
  size_t largest_ = 0;     ///< the largest block mapped
};

/// `empty` from the host cache for a CPU tensor, LibTorch's allocator on
/// any other device (whose own allocator caches, as CUDA's does).
at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options);

/// For the reduce-scatter's output, which becomes the shards' gradients
/// and lives until zero_grad: LibTorch's allocator when it is the tensor
/// pool (Note [FSDP's buffer cache]), empty_buffer otherwise.
at::Tensor empty_gradient_shards(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace strata::strategies::detail
