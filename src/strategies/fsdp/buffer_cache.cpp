// FSDP's cache of large host buffers.
#include "buffer_cache.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "strata/runtime/process.h"

namespace strata::strategies::detail {

// Note [FSDP's buffer cache]
// Every step an FSDP unit allocates and frees, on each rank, its gathered
// parameters, its gradient block and the reduce-scatter's output: blocks
// of the unit's full size, and of its shard's size, many times per step,
// between long-lived allocations of other sizes (AdamW's moments). In
// glibc's heap, which strata's workers keep between steps (Note [Allocator
// settings] in src/runtime/process.cpp), the holes they left could not be
// reused by the next, differently placed requests: the heap's free part
// grew by about 100 MB per step on GPT large (bench_ddp --memory-trace).
// Handing every such buffer to the kernel instead (a lower mmap threshold)
// bounds the memory but page-faults each one in again every step, 4 KB at
// a time: 12-25% slower steps on GPT small and medium.
//
// So these blocks bypass malloc: each is mapped on its own, 2 MB aligned
// and advised for transparent huge pages, so filling one costs a fault per
// 2 MB rather than per 4 KB where the kernel allows it. A freed block
// waits under its exact size for the next request of that size, which in
// FSDP comes within the step (every Block unit has the same sizes). What
// waits idle is bounded in memory, not in mappings: beyond kWarmBlocks of
// the largest block, a returned block gives its pages back (MADV_DONTNEED)
// and keeps its mapping, so it leaves the resident set at once and costs
// only the faults when taken again. That is what happens to the shards'
// gradients that zero_grad drops: they wait through the next forward,
// which needs only a unit or two of gathered parameters, without counting
// in its peak.
//
// Under the tensor pool (Note [The tensor pool] in src/runtime/heap.cpp),
// the default, the shards' gradients (the reduce-scatter's outputs) come
// from the pool instead (empty_gradient_shards): they are made during
// backward, while the activations are freed, and live until zero_grad, so
// in the pool they take the pages the activations gave up, where in the
// cache they came on top of them: GPT large's training peak at 2 ranks
// fell by about 50 MB (docs/benchmarks.md, "FSDP's memory"). The blocks
// that come back within the step (gathered parameters, gradient blocks)
// stay here: the pool serves blocks over 16 MB from mappings of their own,
// given back when freed, which page-faulted each unit's blocks in again
// every step (1.4x slower steps, measured).
struct BufferCache::Block {
  void* data;
  size_t bytes;   // the size asked for (the key)
  size_t mapped;  // the mapping's length, whole huge pages
  bool warm;      // keeps its pages
};

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/// A fresh mapping of `bytes` (whole huge pages), 2 MB aligned.
void* map_block(size_t bytes) {
  const size_t padded = bytes + kHugePage;
  void* raw = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "[fsdp] could not map a buffer of ", bytes, " bytes: ",
                     std::strerror(errno));
  }
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  void* data = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  ::madvise(data, bytes, MADV_HUGEPAGE);  // a hint: nothing changes where the kernel declines
#endif
  return data;
}

}  // namespace

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
      if (block->warm) idle_bytes_ -= block->mapped;
      else held_bytes_ += block->mapped;  // its pages come back as it is written
    }
  }
  if (block == nullptr) {
    const size_t mapped = round_up(bytes, kHugePage);
    block = new Block{map_block(mapped), bytes, mapped, true};
    std::lock_guard<std::mutex> lock(mutex_);
    held_bytes_ += mapped;
    largest_ = std::max(largest_, mapped);
  }
  block->warm = true;
  return c10::DataPtr(block->data, block, &BufferCache::give_back, c10::Device(c10::kCPU));
}

void BufferCache::give_back(void* context) {
  auto* block = static_cast<Block*>(context);
  BufferCache& cache = host();
  std::lock_guard<std::mutex> lock(cache.mutex_);
  std::vector<Block*>& same = cache.idle_[block->bytes];
  if (cache.idle_bytes_ + block->mapped > kWarmBlocks * cache.largest_) {
    // Under the lock, so no one takes the block before its pages are gone.
    ::madvise(block->data, block->mapped, MADV_DONTNEED);
    block->warm = false;
    cache.held_bytes_ -= block->mapped;
    same.insert(same.begin(), block);  // warm ones stay at the back, taken first
  } else {
    cache.idle_bytes_ += block->mapped;
    same.push_back(block);
  }
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
      ::munmap(block->data, block->mapped);
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

at::Tensor empty_gradient_shards(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cpu() && runtime::tensor_pool_installed()) return at::empty(sizes, options);
  return empty_buffer(sizes, options);
}

}  // namespace strata::strategies::detail
