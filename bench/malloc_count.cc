// A malloc counter for the benchmarks: preloaded (LD_PRELOAD), it counts
// every malloc, calloc and realloc of the process, and those of its main
// thread apart, and passes each on to the malloc that serves the process
// (glibc's, or a preloaded mimalloc listed after it). bench_xla finds
// strata_bench_malloc_count() and reports mallocs per step:
//
//   LD_PRELOAD=build/bench/libstrata_malloc_count.so build/bench/bench_xla --sides xla
//
// A counter adds an atomic increment to every call, so time the steps
// without it.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>

extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);

namespace {

std::atomic<long> g_all{0}, g_main{0};

using Malloc = void* (*)(size_t);
using Calloc = void* (*)(size_t, size_t);
using Realloc = void* (*)(void*, size_t);

// While dlsym looks the next malloc up it may allocate itself: those calls
// go to glibc's directly.
thread_local bool t_resolving = false;

template <class F>
F next(const char* name, F fallback) {
  static thread_local int depth = 0;
  if (t_resolving || depth > 0) return fallback;
  t_resolving = true;
  ++depth;
  auto f = reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
  --depth;
  t_resolving = false;
  return f != nullptr ? f : fallback;
}

void count() {
  g_all.fetch_add(1, std::memory_order_relaxed);
  static const pid_t main_thread = ::getpid();
  if (static_cast<pid_t>(::syscall(SYS_gettid)) == main_thread) g_main.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

extern "C" {

/// The calls counted so far: the main thread's (main_only != 0) or all.
long strata_bench_malloc_count(int main_only) { return (main_only ? g_main : g_all).load(std::memory_order_relaxed); }

void* malloc(size_t n) {
  static Malloc f = nullptr;
  if (f == nullptr) f = next<Malloc>("malloc", nullptr);
  count();
  return f != nullptr ? f(n) : __libc_malloc(n);
}

void* calloc(size_t k, size_t n) {
  static Calloc f = nullptr;
  if (f == nullptr) f = next<Calloc>("calloc", nullptr);
  count();
  return f != nullptr ? f(k, n) : __libc_calloc(k, n);
}

void* realloc(void* p, size_t n) {
  static Realloc f = nullptr;
  if (f == nullptr) f = next<Realloc>("realloc", nullptr);
  count();
  return f != nullptr ? f(p, n) : __libc_realloc(p, n);
}

}  // extern "C"
