// FSDP's cache of large host buffers.
#include "buffer_cache.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace strata::strategies::detail {

// Note [FSDP's buffer cache]
// Every step an FSDP unit allocates and frees, on each rank, its gathered
// parameters and the gather and reduce buffers: blocks of the unit's full
// size (28 MB per rank for a GPT Block of width 768 at 2 ranks), many
// times per step, between long-lived allocations of other sizes (the
// shards' gradients, AdamW's moments). With the heap kept between steps
// (Note [Allocator settings] in src/runtime/process.cpp) glibc could not
// reuse the holes they left for the next, differently placed requests: the
// heap's free part grew by about 100 MB per step on GPT large (bench_ddp
// --memory-trace), and FSDP's training peak was 0.80x DDP's at 2 ranks
// while its live memory was half. Handing such blocks to the kernel
// instead (a lower mmap threshold) bounds the peak but page-faults every
// buffer in again each step: 12-25% slower steps on GPT small and medium.
// This cache keeps each freed block under its exact size and hands it to
// the next request of that size, which in FSDP comes within the same step
// (every Block unit has the same sizes). What it holds idle is at most the
// most buffers of one size alive at once, which the schedule bounds (the
// unit computing, one prefetched, two reductions in flight).
struct BufferCache::Block {
  void* data;
  size_t bytes;
};

BufferCache& BufferCache::host() {
  static BufferCache* cache = new BufferCache();  // never destroyed: see the header
  return *cache;
}

c10::DataPtr BufferCache::allocate(size_t bytes) {
  if (bytes < kMinBytes) return c10::GetCPUAllocator()->allocate(bytes);
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = idle_.find(bytes);
    if (it != idle_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      idle_bytes_ -= bytes;
    }
  }
  if (block == nullptr) {
    block = new Block{c10::alloc_cpu(bytes), bytes};
    std::lock_guard<std::mutex> lock(mutex_);
    held_bytes_ += bytes;
  }
  return c10::DataPtr(block->data, block, &BufferCache::give_back, c10::Device(c10::kCPU));
}

void BufferCache::give_back(void* context) {
  auto* block = static_cast<Block*>(context);
  BufferCache& cache = host();
  std::lock_guard<std::mutex> lock(cache.mutex_);
  cache.idle_[block->bytes].push_back(block);
  cache.idle_bytes_ += block->bytes;
}

void BufferCache::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

at::Tensor BufferCache::empty(at::IntArrayRef sizes, c10::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(sizes);
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, allocate(bytes), this, /*resizable=*/true);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, sizes);
}

void BufferCache::release() {
  std::unordered_map<size_t, std::vector<Block*>> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    idle.swap(idle_);
    held_bytes_ -= idle_bytes_;
    idle_bytes_ = 0;
  }
  for (auto& [bytes, blocks] : idle) {
    for (Block* block : blocks) {
      c10::free_cpu(block->data);
      delete block;
    }
  }
}

size_t BufferCache::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

size_t BufferCache::held_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_bytes_;
}

at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu()) return BufferCache::host().empty(sizes, c10::typeMetaToScalarType(options.dtype()));
  return at::empty(sizes, options);
}

}  // namespace strata::strategies::detail
