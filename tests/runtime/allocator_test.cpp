// The worker's heap (Note [Allocator settings] in process.cpp): kept by
// default, handed back to the kernel block by block with STRATA_HEAP=lean,
// and a bad value refused with the variable's name.
#include <gtest/gtest.h>

#include <malloc.h>

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

std::string run_with_heap(const char* mode) {
  if (mode != nullptr) {
    ::setenv("STRATA_HEAP", mode, 1);
  } else {
    ::unsetenv("STRATA_HEAP");
  }
  auto run = strata::testing::run_workers(1, "heap_mode");
  ::unsetenv("STRATA_HEAP");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  return run.output;
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
    EXPECT_STREQ(e.what(), "[runtime] STRATA_HEAP is 'small'; use keep (the default: freed memory stays in the heap, "
                           "fastest) or lean (freed blocks of 128 KB or more go back to the kernel: lower peak "
                           "memory, slower steps)");
  }
}

}  // namespace
