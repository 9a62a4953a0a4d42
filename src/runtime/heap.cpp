// The worker's heap: where LibTorch's CPU tensors and malloc's blocks live
// (Note [Allocator settings], Note [The tensor pool]).
#include <dlfcn.h>
#include <malloc.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/process.h"

namespace strata::runtime {
namespace {

// Note [Allocator settings]
// glibc returns freed memory at the top of the heap to the kernel after
// every step (trim) and serves large tensors with fresh mmaps, so each
// training step page-faults its temporaries in again: measured (bench/
// run_ddp.sh, LibTorch 1.13 with OpenBLAS) as 2.5x slower MLP steps and
// 1.5x slower GPT steps than with the heap kept. So a worker's glibc keeps
// its heap (no trim, mmap only above 32 MB), unless the user tuned malloc
// already (MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ set).
//
// The kept heap costs memory, though: what one phase frees stays resident
// while the next allocates elsewhere in it, and under FSDP, where the state
// is small, that was a third of the training peak (GPT large: 0.69x DDP's
// peak at 2 ranks). glibc's heap is one address range per arena, served
// best-fit from its free lists; the backward's transients (each unit's
// full weight gradients) do not fit the holes the freed activations leave
// beside live state, so it grows at its top, and the holes stay resident.
// STRATA_HEAP=lean hands every freed block of 128 KB or more back to the
// kernel at once: no holes, but every activation and temporary is page-
// faulted in again each step (12-20% slower FSDP steps).
//
// Note [The tensor pool]
// The default since then (STRATA_HEAP unset or "pool") gives LibTorch's
// CPU tensors their own allocator, installed with c10::SetCPUAllocator:
// mimalloc (Debian's libmimalloc2.0, which scripts/install-deps.sh
// installs), opened with RTLD_LOCAL so that only tensors use it, while
// malloc and everything else in the process stay glibc's. mimalloc carves
// blocks of up to 16 MB out of 32 MB segments, in size classes whose free
// pages it merges and splits again, so one phase's freed tensors serve the
// next phase's requests of other sizes; glibc's single heap could not
// place those in the holes (above). And it gives a span of free pages back
// to the kernel only after the span has stayed free for the decommit
// delay, which the pool sets to 2 s (MIMALLOC_DECOMMIT_DELAY, and
// MIMALLOC_PURGE_DELAY for mimalloc 2.1, unless the user set them):
// longer than a step, so what a step frees is there for the next step
// rather than faulted in again, while what no step needs goes back within
// seconds. mimalloc's own 25 ms gave 2.7x the kept heap's page faults on
// GPT large under FSDP (1.1x slower steps); 0.5 s to 2 s give fewer than
// the kept heap, with the same peaks.
//
// Measured on GPT large, context 64, batch 2 (docs/benchmarks.md, "FSDP's
// memory by default"): FSDP's training peak over the start fell from 1104
// MB (kept heap) to 856 MB at 2 ranks and from 715 to 568 MB at 4, with
// steps no slower; lean's were 814 and 518 MB. DDP's fell by 4-5%. (Backward
// in order on CPU workers, Note [Overlap in backward], took them to 801
// and 512 MB since.)
//
// Blocks are 64-byte aligned, as c10's own allocator makes them (its
// vectorized kernels assume it). Tensors made before the pool was
// installed keep their own deleter, so switching in the middle of a
// process is safe. Where libmimalloc cannot be opened, the default falls
// back to the kept glibc heap and says so once; STRATA_HEAP=pool asked for
// explicitly is an error there instead. STRATA_MIMALLOC names another
// build of the library (a path, or a name dlopen searches for).
//
// Under AddressSanitizer (scripts/test-asan.sh) the default is the kept
// glibc heap instead: ASan sees only what goes through malloc, so tensors
// in the pool would hide their overflows and uses after free from it.

struct Mimalloc {
  void* (*malloc_aligned)(size_t, size_t) = nullptr;
  void (*free)(void*) = nullptr;
  size_t (*usable_size)(const void*) = nullptr;
  void (*collect)(bool) = nullptr;
  void (*process_info)(size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*) = nullptr;
};

Mimalloc g_mimalloc;
std::atomic<size_t> g_pool_in_use{0};
std::string g_mode = "keep";
std::atomic<bool> g_pool_installed{false};
std::once_flag g_settings_once;

constexpr size_t kTensorAlignment = 64;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
#else
constexpr bool kUnderAddressSanitizer = false;
#endif

// The libmimalloc to load: STRATA_MIMALLOC names another build of it.
std::string mimalloc_library() {
  const char* chosen = std::getenv("STRATA_MIMALLOC");
  return chosen != nullptr && *chosen != '\0' ? chosen : "libmimalloc.so.2";
}

// Loads libmimalloc (a library loaded once stays); its handle, or nullptr
// with why not in `why`.
void* load_mimalloc(std::string& why, int mode = RTLD_LAZY) {
  const std::string name = mimalloc_library();
  void* handle = ::dlopen(name.c_str(), mode | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    why = error != nullptr ? std::string(error).substr(0, 512) : name + ": not found";
  }
  return handle;
}

// Opens libmimalloc and finds the functions the pool calls; "" on success,
// otherwise why not.
std::string open_mimalloc(Mimalloc& mi) {
  std::string why;
  void* handle = load_mimalloc(why, RTLD_NOW);
  if (handle == nullptr) return why;
  auto find = [&](const char* symbol, auto& slot) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(::dlsym(handle, symbol));
    return slot != nullptr;
  };
  if (!find("mi_malloc_aligned", mi.malloc_aligned) || !find("mi_free", mi.free) ||
      !find("mi_usable_size", mi.usable_size) || !find("mi_collect", mi.collect) ||
      !find("mi_process_info", mi.process_info)) {
    return "libmimalloc lacks the mi_* functions the pool calls (mimalloc 2.0 or newer has them)";
  }
  return "";
}

void release_to_pool(void* data) {
  if (data == nullptr) return;
  g_pool_in_use.fetch_sub(g_mimalloc.usable_size(data), std::memory_order_relaxed);
  g_mimalloc.free(data);
}

class TensorPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, &release_to_pool, c10::Device(c10::DeviceType::CPU)};
    void* data = g_mimalloc.malloc_aligned(bytes, kTensorAlignment);
    TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, "[runtime] the tensor pool could not allocate ", bytes,
                     " bytes (STRATA_HEAP=pool, mimalloc): out of memory");
    g_pool_in_use.fetch_add(g_mimalloc.usable_size(data), std::memory_order_relaxed);
    return {data, data, &release_to_pool, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_to_pool; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    default_copy_data(destination, source, count);
  }
};

void keep_glibc_heap(bool lean) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) return;
  if (lean) {
    ::mallopt(M_MMAP_THRESHOLD, 128 << 10);
    ::mallopt(M_TRIM_THRESHOLD, 128 << 10);
  } else {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
}

void install_tensor_pool(bool asked) {
  for (const char* delay : {"MIMALLOC_DECOMMIT_DELAY", "MIMALLOC_PURGE_DELAY"}) {
    ::setenv(delay, "2000", /*overwrite=*/0);  // read when the library loads
  }
  const std::string why = open_mimalloc(g_mimalloc);
  if (!why.empty()) {
    STRATA_CHECK(!asked, ConfigError, "[runtime] STRATA_HEAP=pool needs mimalloc, and it cannot be loaded (", why,
                 "); install it (Debian: apt-get install libmimalloc2.0, which scripts/install-deps.sh does), or "
                 "choose STRATA_HEAP=keep or lean");
    log::warning("[runtime] the tensor pool needs mimalloc, which cannot be loaded (", why,
                 "): tensors stay in glibc's kept heap, whose training peak is higher under FSDP. Install "
                 "libmimalloc2.0 (Debian), or set STRATA_HEAP=keep to choose this and silence the warning");
    g_mode = "keep";
    return;
  }
  static TensorPool pool;
  c10::SetCPUAllocator(&pool, /*priority=*/0);
  g_mode = "pool";
  g_pool_installed.store(true, std::memory_order_release);
}

// Note [The process's malloc]
// The tensor pool above serves LibTorch's tensors only. Everything else a
// step allocates (autograd's nodes, TensorImpls, the xla device's graph
// nodes and its plugin's buffers) goes through glibc's malloc, which on
// the xla step's host side is a third of the recording thread's time:
// GPT tiny on the CPU plugin made about 12,000 mallocs a step on that
// thread (docs/benchmarks.md). malloc cannot be replaced once a process
// runs, so STRATA_MALLOC=mimalloc starts the program again with
// libmimalloc preloaded (LD_PRELOAD): exec keeps the process id, the
// arguments, open descriptors and the environment, and what it runs is
// the same program from main() on. The variable STRATA_MALLOC_EXEC marks
// the second start, so a preload the dynamic loader ignored warns once
// instead of looping. Two options keep a step's memory mapped from one
// step to the next: MIMALLOC_RESERVE_OS_MEMORY reserves address space
// (not memory) from which mimalloc serves large blocks, where it would
// otherwise map and unmap each of the CPU plugin's per-execution arenas
// (4,400 page faults a step on GPT tiny without it, 71 with it); and the
// pool's decommit delay (2 s). A child started by the launcher gets the
// same variables. `strata train --accelerator xla` prefers mimalloc when
// STRATA_MALLOC is unset (measured there: docs/benchmarks.md, "The
// process's malloc on the xla step"); everything else keeps glibc's by
// default, whose settings the rest of this file and the xla device's
// Note [The CPU plugin's temporaries stay mapped] tune.
constexpr const char* kExecMark = "STRATA_MALLOC_EXEC";

std::string malloc_choice() {
  const char* env = std::getenv("STRATA_MALLOC");
  const std::string choice = env != nullptr ? env : "";
  STRATA_CHECK(choice.empty() || choice == "system" || choice == "mimalloc", ConfigError, "[runtime] STRATA_MALLOC is '",
               choice.substr(0, 64),
               "'; use system (glibc's malloc, the default) or mimalloc (the whole process on libmimalloc, "
               "preloaded: faster host-side allocation)");
  return choice.empty() ? "system" : choice;
}

bool preloads(const std::string& library) {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return false;
  const std::string list = preload;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = list.find_first_of(": ", at);
    if (list.substr(at, end == std::string::npos ? std::string::npos : end - at) == library) return true;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return false;
}

// The program's arguments as the kernel holds them.
std::vector<std::string> own_arguments() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return args;
}

}  // namespace

std::string process_malloc() {
  void* serving = ::dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (serving == nullptr || ::dladdr(serving, &info) == 0 || info.dli_fname == nullptr) return "glibc";
  return std::strstr(info.dli_fname, "mimalloc") != nullptr ? "mimalloc" : "glibc";
}

std::map<std::string, std::string> process_malloc_environment() {
  if (malloc_choice() != "mimalloc") return {};
  if (kUnderAddressSanitizer) {
    log::warning("[runtime] STRATA_MALLOC=mimalloc is ignored under AddressSanitizer, which checks glibc's malloc");
    return {};
  }
  const std::string library = mimalloc_library();
  if (process_malloc() == "mimalloc" && preloads(library)) return {};  // children inherit it
  std::string why;
  if (load_mimalloc(why) == nullptr) {
    throw ConfigError("[runtime] STRATA_MALLOC=mimalloc needs libmimalloc, which cannot be loaded (" + why +
                      "); install it (Debian: apt-get install libmimalloc2.0, which scripts/install-deps.sh does), "
                      "point STRATA_MIMALLOC at a build of it, or unset STRATA_MALLOC");
  }
  const char* preload = std::getenv("LD_PRELOAD");
  std::map<std::string, std::string> vars;
  vars["LD_PRELOAD"] = preload != nullptr && *preload != '\0' ? library + ":" + preload : library;
  auto option = [&](const char* name, const char* value) {
    const char* set = std::getenv(name);
    vars[name] = set != nullptr ? set : value;
  };
  option("MIMALLOC_RESERVE_OS_MEMORY", "4GiB");
  option("MIMALLOC_DECOMMIT_DELAY", "2000");
  option("MIMALLOC_PURGE_DELAY", "2000");
  return vars;
}

void apply_process_malloc(const std::string& preferred) {
  STRATA_CHECK(preferred == "system" || preferred == "mimalloc", ConfigError,
               "[runtime] apply_process_malloc: '", preferred, "' is not a malloc; use system or mimalloc");
  const char* asked = std::getenv("STRATA_MALLOC");
  if ((asked == nullptr || *asked == '\0') && preferred == "mimalloc") {
    // A default, not a demand: glibc's stays where mimalloc cannot serve.
    if (kUnderAddressSanitizer) return;
    std::string why;
    if (load_mimalloc(why) == nullptr) {
      log::warning("[runtime] this program prefers mimalloc as its malloc, which cannot be loaded (", why,
                   "): it runs on glibc's. Install libmimalloc2.0 (Debian), or set STRATA_MALLOC=system to "
                   "choose glibc's and silence this warning");
      return;
    }
    ::setenv("STRATA_MALLOC", "mimalloc", 1);
  }
  if (malloc_choice() != "mimalloc") return;
  if (process_malloc() == "mimalloc") {
    if (std::getenv(kExecMark) != nullptr) {
      static std::once_flag said;
      std::call_once(said, [] { log::info("[runtime] this process runs on mimalloc (STRATA_MALLOC=mimalloc)"); });
    }
    return;
  }
  const std::map<std::string, std::string> vars = process_malloc_environment();
  if (vars.empty()) return;  // under AddressSanitizer
  if (std::getenv(kExecMark) != nullptr) {
    log::warning("[runtime] STRATA_MALLOC=mimalloc: the program started again with ", vars.at("LD_PRELOAD"),
                 " preloaded, yet malloc is still glibc's; it stays so");
    return;
  }
  const std::vector<std::string> args = own_arguments();
  STRATA_CHECK(!args.empty(), ConfigError, "[runtime] STRATA_MALLOC=mimalloc: cannot read this program's arguments "
                                           "(/proc/self/cmdline) to start it again with mimalloc");
  for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  ::setenv(kExecMark, "1", 1);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);  // what the first start printed is not lost with it
  ::execv("/proc/self/exe", argv.data());
  const int error = errno;
  throw ConfigError("[runtime] STRATA_MALLOC=mimalloc: cannot start this program again with mimalloc preloaded (" +
                    std::string(std::strerror(error)) + "); unset STRATA_MALLOC");
}

void apply_allocator_settings() {
  const char* heap = std::getenv("STRATA_HEAP");
  const std::string mode = heap != nullptr ? heap : "";
  STRATA_CHECK(mode.empty() || mode == "pool" || mode == "keep" || mode == "lean", ConfigError,
               "[runtime] STRATA_HEAP is '", mode.substr(0, 64),
               "'; use pool (the default: tensors in a mimalloc pool that reuses freed memory across sizes), keep "
               "(glibc keeps its freed memory: a higher peak) or lean (freed blocks of 128 KB or more go "
               "back to the kernel: lowest peak, slower steps)");
  std::call_once(g_settings_once, [&] {
    keep_glibc_heap(mode == "lean");
    if (mode == "lean" || mode == "keep") {
      g_mode = mode;
    } else if (mode.empty() && kUnderAddressSanitizer) {
      g_mode = "keep";  // ASan checks what malloc serves (Note [The tensor pool])
    } else {
      install_tensor_pool(/*asked=*/mode == "pool");
    }
  });
}

void release_free_memory() {
  ::malloc_trim(0);
  if (tensor_pool_installed()) g_mimalloc.collect(true);
}

bool tensor_pool_installed() { return g_pool_installed.load(std::memory_order_acquire); }

TensorHeapStats tensor_heap_stats() {
  TensorHeapStats stats;
  stats.mode = g_mode;
  if (!tensor_pool_installed()) return stats;
  stats.in_use = g_pool_in_use.load(std::memory_order_relaxed);
  size_t unused = 0;
  size_t commit = 0;
  g_mimalloc.process_info(&unused, &unused, &unused, &unused, &unused, &commit, &unused, &unused);
  stats.committed = commit;
  return stats;
}

}  // namespace strata::runtime
