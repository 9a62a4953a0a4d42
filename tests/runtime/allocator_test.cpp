// The worker's heap (Note [Allocator settings], Note [The tensor pool] in
// src/runtime/heap.cpp): tensors in the mimalloc pool by default, glibc's
// heap kept, handed back to the kernel block by block with
// STRATA_HEAP=lean, and a bad value refused with the variable's name.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <malloc.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "strata/core/error.h"
#include "strata/runtime/process.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

// Prints whether a freed 1 MB block went back to the kernel: under lean it
// was its own mapping (counted in hblkhd while alive), under keep it came
// from the heap and stays there once freed.
STRATA_WORKER(heap_mode) {
  strata::runtime::apply_allocator_settings();
  const size_t before = ::mallinfo2().hblkhd;
  auto* volatile block = static_cast<char*>(std::malloc(1 << 20));  // volatile: the pair must not be elided
  block[0] = 1;
  const size_t during = ::mallinfo2().hblkhd;
  std::free(block);
  std::cout << "mapped apart: " << (during >= before + (1 << 20) ? "yes" : "no") << std::endl;
  return 0;
}

// Where an 8 MB tensor's bytes come from: the pool's count of live bytes
// and malloc's, before, while it lives and after; its alignment; and that
// a plain malloc stays glibc's.
STRATA_WORKER(tensor_heap) {
  strata::runtime::apply_allocator_settings();
  auto malloc_in_use = [] {
    struct mallinfo2 info = ::mallinfo2();
    return info.uordblks + info.hblkhd;
  };
  constexpr size_t kBytes = size_t{8} << 20;
  const auto pool_before = strata::runtime::tensor_heap_stats();
  const size_t malloc_before = malloc_in_use();
  at::Tensor tensor = at::ones({static_cast<int64_t>(kBytes / sizeof(float))});
  const auto pool_during = strata::runtime::tensor_heap_stats();
  const size_t malloc_during = malloc_in_use();
  const auto address = reinterpret_cast<uintptr_t>(tensor.data_ptr());
  const float sum = tensor.sum().item<float>();
  tensor = at::Tensor();
  const auto pool_after = strata::runtime::tensor_heap_stats();
  auto* volatile block = static_cast<char*>(std::malloc(kBytes));  // volatile: the pair must not be elided
  block[0] = 1;
  const size_t malloc_block = malloc_in_use();
  std::free(block);
  std::cout << "mode: " << pool_during.mode << "\n"
            << "installed: " << (strata::runtime::tensor_pool_installed() ? "yes" : "no") << "\n"
            << "pool held the tensor: " << (pool_during.in_use >= pool_before.in_use + kBytes ? "yes" : "no") << "\n"
            << "pool had it back: " << (pool_after.in_use == pool_before.in_use ? "yes" : "no") << "\n"
            << "pool committed it: " << (pool_during.committed >= pool_during.in_use ? "yes" : "no") << "\n"
            << "malloc held the tensor: " << (malloc_during >= malloc_before + kBytes ? "yes" : "no") << "\n"
            << "malloc held the block: " << (malloc_block >= malloc_before + kBytes ? "yes" : "no") << "\n"
            << "aligned to 64: " << (address % 64 == 0 ? "yes" : "no") << "\n"
            << "decommit delay: " << (std::getenv("MIMALLOC_DECOMMIT_DELAY") ? std::getenv("MIMALLOC_DECOMMIT_DELAY") : "unset")
            << "\n"
            << "sum: " << sum << std::endl;
  return 0;
}

// Which malloc serves the worker after apply_process_malloc (Note [The
// process's malloc]), whether it started again to get it, and whether a
// block it allocates lies in mimalloc's heap. With an argument "ask", the
// worker itself sets STRATA_MALLOC=mimalloc first, as a program whose
// environment asks for it when it starts; with "prefer", it prefers
// mimalloc, as `strata train --accelerator xla` does.
STRATA_WORKER(process_malloc) {
  if (!args.empty() && args[0] == "ask") ::setenv("STRATA_MALLOC", "mimalloc", 1);
  strata::runtime::apply_process_malloc(!args.empty() && args[0] == "prefer" ? "mimalloc" : "system");
  auto* volatile block = static_cast<char*>(std::malloc(4096));  // volatile: the pair must not be elided
  block[0] = 1;
  using InHeap = bool (*)(const void*);
  auto owned = reinterpret_cast<InHeap>(::dlsym(RTLD_DEFAULT, "mi_check_owned"));
  const bool mimalloc_block = owned != nullptr && owned(block);
  std::free(block);
  const char* mark = std::getenv("STRATA_MALLOC_EXEC");
  std::cout << "malloc: " << strata::runtime::process_malloc() << "\n"
            << "started again: " << (mark != nullptr ? "yes" : "no") << "\n"
            << "block in mimalloc's heap: " << (mimalloc_block ? "yes" : "no") << "\n"
            << "reserve: " << (std::getenv("MIMALLOC_RESERVE_OS_MEMORY") ? std::getenv("MIMALLOC_RESERVE_OS_MEMORY") : "unset")
            << std::endl;
  return 0;
}

// Runs `worker` in one process under STRATA_HEAP=`mode` (nullptr: unset)
// and STRATA_MIMALLOC=`library` (nullptr: unset); its output.
std::string run_with_heap(const char* mode, const char* worker = "heap_mode", const char* library = nullptr) {
  auto set = [](const char* name, const char* value) {
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  };
  set("STRATA_HEAP", mode);
  set("STRATA_MIMALLOC", library);
  auto run = strata::testing::run_workers(1, worker);
  ::unsetenv("STRATA_HEAP");
  ::unsetenv("STRATA_MIMALLOC");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  return run.output;
}

bool has(const std::string& output, const std::string& line) { return output.find(line) != std::string::npos; }

TEST(AllocatorTest, TensorsComeFromThePoolByDefaultAndMallocStaysGlibcs) {
  for (const char* mode : {static_cast<const char*>(nullptr), "pool"}) {
    const std::string out = run_with_heap(mode, "tensor_heap");
    SCOPED_TRACE(out);
    EXPECT_TRUE(has(out, "mode: pool\n"));
    EXPECT_TRUE(has(out, "installed: yes\n"));
    EXPECT_TRUE(has(out, "pool held the tensor: yes\n"));
    EXPECT_TRUE(has(out, "pool had it back: yes\n"));
    EXPECT_TRUE(has(out, "pool committed it: yes\n"));
    EXPECT_TRUE(has(out, "malloc held the tensor: no\n"));  // the pool is not malloc ...
    EXPECT_TRUE(has(out, "malloc held the block: yes\n"));   // ... and malloc is still glibc's
    EXPECT_TRUE(has(out, "aligned to 64: yes\n"));
    EXPECT_TRUE(has(out, "decommit delay: 2000\n"));  // longer than a step (Note [The tensor pool])
    EXPECT_TRUE(has(out, "sum: 2.09715e+06\n"));
  }
  // A delay the user chose stays.
  ::setenv("MIMALLOC_DECOMMIT_DELAY", "100", 1);
  const std::string chosen = run_with_heap(nullptr, "tensor_heap");
  ::unsetenv("MIMALLOC_DECOMMIT_DELAY");
  EXPECT_TRUE(has(chosen, "mode: pool\n")) << chosen;
  EXPECT_TRUE(has(chosen, "decommit delay: 100\n")) << chosen;
}

TEST(AllocatorTest, KeepAndLeanLeaveTensorsInGlibcsHeap) {
  for (const char* mode : {"keep", "lean"}) {
    const std::string out = run_with_heap(mode, "tensor_heap");
    SCOPED_TRACE(out);
    EXPECT_TRUE(has(out, std::string("mode: ") + mode + "\n"));
    EXPECT_TRUE(has(out, "installed: no\n"));
    EXPECT_TRUE(has(out, "pool held the tensor: no\n"));
    EXPECT_TRUE(has(out, "malloc held the tensor: yes\n"));
    EXPECT_TRUE(has(out, "aligned to 64: yes\n"));
  }
}

TEST(AllocatorTest, WithoutMimallocTheDefaultWarnsAndKeepsAndAnExplicitPoolIsRefused) {
  const char* missing = "/nonexistent/libmimalloc.so.2";
  const std::string out = run_with_heap(nullptr, "tensor_heap", missing);
  EXPECT_TRUE(has(out, "mode: keep\n")) << out;
  EXPECT_TRUE(has(out, "malloc held the tensor: yes\n")) << out;
  EXPECT_TRUE(has(out, "[runtime] the tensor pool needs mimalloc, which cannot be loaded (/nonexistent/libmimalloc.so.2: "
                       "cannot open shared object file: No such file or directory): tensors stay in glibc's kept heap"))
      << out;

  ::setenv("STRATA_HEAP", "pool", 1);
  ::setenv("STRATA_MIMALLOC", missing, 1);
  auto run = strata::testing::run_workers(1, "tensor_heap");
  ::unsetenv("STRATA_HEAP");
  ::unsetenv("STRATA_MIMALLOC");
  EXPECT_FALSE(run.ok());
  EXPECT_TRUE(has(run.output, "[runtime] STRATA_HEAP=pool needs mimalloc, and it cannot be loaded (/nonexistent/"
                              "libmimalloc.so.2: cannot open shared object file: No such file or directory); install it "
                              "(Debian: apt-get install libmimalloc2.0, which scripts/install-deps.sh does), or choose "
                              "STRATA_HEAP=keep or lean"))
      << run.output;
}

TEST(AllocatorTest, TheHeapKeepsAMegabyteByDefaultAndLeanHandsItBack) {
  EXPECT_NE(run_with_heap(nullptr).find("mapped apart: no"), std::string::npos);
  EXPECT_NE(run_with_heap("keep").find("mapped apart: no"), std::string::npos);
  EXPECT_NE(run_with_heap("lean").find("mapped apart: yes"), std::string::npos);
}

TEST(AllocatorTest, AnUnknownHeapModeIsAConfigErrorNamingTheVariable) {
  ::setenv("STRATA_HEAP", "small", 1);
  try {
    strata::runtime::apply_allocator_settings();
    ::unsetenv("STRATA_HEAP");
    FAIL() << "STRATA_HEAP=small was accepted";
  } catch (const strata::ConfigError& e) {
    ::unsetenv("STRATA_HEAP");
    EXPECT_STREQ(e.what(), "[runtime] STRATA_HEAP is 'small'; use pool (the default: tensors in a mimalloc pool that "
                           "reuses freed memory across sizes), keep (glibc keeps its freed memory: a higher peak) or "
                           "lean (freed blocks of 128 KB or more go back to the kernel: lowest peak, slower "
                           "steps)");
  }
}

TEST(AllocatorTest, StrataMallocMimallocStartsWorkersOnItAndAProgramAskingForItStartsAgain) {
  // Unset: glibc's, and nothing started again.
  {
    auto run = strata::testing::run_workers(1, "process_malloc");
    ASSERT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
    EXPECT_TRUE(has(run.output, "malloc: glibc\n")) << run.output;
    EXPECT_TRUE(has(run.output, "started again: no\n")) << run.output;
    EXPECT_TRUE(has(run.output, "block in mimalloc's heap: no\n")) << run.output;
  }
  // Asked of the launcher: the worker starts preloaded, with the options
  // that keep large blocks mapped.
  ::setenv("STRATA_MALLOC", "mimalloc", 1);
  auto launched = strata::testing::run_workers(1, "process_malloc");
  ::unsetenv("STRATA_MALLOC");
  ASSERT_TRUE(launched.ok()) << launched.launch.summary << "\n" << launched.output;
  EXPECT_TRUE(has(launched.output, "malloc: mimalloc\n")) << launched.output;
  EXPECT_TRUE(has(launched.output, "started again: no\n")) << launched.output;
  EXPECT_TRUE(has(launched.output, "block in mimalloc's heap: yes\n")) << launched.output;
  EXPECT_TRUE(has(launched.output, "reserve: 4GiB\n")) << launched.output;
  // Asked by the program itself: it starts again, the same process, on
  // mimalloc.
  auto asked = strata::testing::run_workers(1, "process_malloc", {"ask"});
  ASSERT_TRUE(asked.ok()) << asked.launch.summary << "\n" << asked.output;
  EXPECT_TRUE(has(asked.output, "malloc: mimalloc\n")) << asked.output;
  EXPECT_TRUE(has(asked.output, "started again: yes\n")) << asked.output;
  EXPECT_TRUE(has(asked.output, "block in mimalloc's heap: yes\n")) << asked.output;
}

TEST(AllocatorTest, APreferredMimallocStartsTheProgramOnItOrWarnsAndKeepsGlibcsWhereItIsMissing) {
  auto preferred = strata::testing::run_workers(1, "process_malloc", {"prefer"});
  ASSERT_TRUE(preferred.ok()) << preferred.launch.summary << "\n" << preferred.output;
  EXPECT_TRUE(has(preferred.output, "malloc: mimalloc\n")) << preferred.output;
  EXPECT_TRUE(has(preferred.output, "started again: yes\n")) << preferred.output;
  EXPECT_TRUE(has(preferred.output, "[runtime] this process runs on mimalloc (STRATA_MALLOC=mimalloc)"))
      << preferred.output;
  // Missing: a warning, glibc's malloc, and the program goes on.
  ::setenv("STRATA_MIMALLOC", "/nonexistent/libmimalloc.so.2", 1);
  auto missing = strata::testing::run_workers(1, "process_malloc", {"prefer"});
  ::unsetenv("STRATA_MIMALLOC");
  ASSERT_TRUE(missing.ok()) << missing.launch.summary << "\n" << missing.output;
  EXPECT_TRUE(has(missing.output, "malloc: glibc\n")) << missing.output;
  EXPECT_TRUE(has(missing.output, "started again: no\n")) << missing.output;
  EXPECT_TRUE(has(missing.output, "[runtime] this program prefers mimalloc as its malloc, which cannot be loaded "
                                  "(/nonexistent/libmimalloc.so.2: cannot open shared object file: No such file or "
                                  "directory): it runs on glibc's. Install libmimalloc2.0 (Debian), or set "
                                  "STRATA_MALLOC=system to choose glibc's and silence this warning"))
      << missing.output;
  // STRATA_MALLOC=system wins over the preference.
  ::setenv("STRATA_MALLOC", "system", 1);
  auto system = strata::testing::run_workers(1, "process_malloc", {"prefer"});
  ::unsetenv("STRATA_MALLOC");
  ASSERT_TRUE(system.ok()) << system.launch.summary << "\n" << system.output;
  EXPECT_TRUE(has(system.output, "malloc: glibc\n")) << system.output;
}

TEST(AllocatorTest, AnUnknownMallocOrAMissingMimallocIsAConfigErrorSayingWhatToDo) {
  auto error_of = [] {
    try {
      (void)strata::runtime::process_malloc_environment();
    } catch (const strata::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ::setenv("STRATA_MALLOC", "jemalloc", 1);
  const std::string unknown = error_of();
  ::setenv("STRATA_MALLOC", "mimalloc", 1);
  ::setenv("STRATA_MIMALLOC", "/nonexistent/libmimalloc.so.2", 1);
  const std::string missing = error_of();
  ::unsetenv("STRATA_MALLOC");
  ::unsetenv("STRATA_MIMALLOC");
  EXPECT_EQ(unknown, "[runtime] STRATA_MALLOC is 'jemalloc'; use system (glibc's malloc, the default) or mimalloc "
                     "(the whole process on libmimalloc, preloaded: faster host-side allocation)");
  EXPECT_EQ(missing, "[runtime] STRATA_MALLOC=mimalloc needs libmimalloc, which cannot be loaded "
                     "(/nonexistent/libmimalloc.so.2: cannot open shared object file: No such file or directory); "
                     "install it (Debian: apt-get install libmimalloc2.0, which scripts/install-deps.sh does), point "
                     "STRATA_MIMALLOC at a build of it, or unset STRATA_MALLOC");
  EXPECT_TRUE(strata::runtime::process_malloc_environment().empty());  // unset: glibc's, nothing to pass on
}

}  // namespace
