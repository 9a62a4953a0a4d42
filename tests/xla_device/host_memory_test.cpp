// The CPU plugin's temporary arena stays mapped from one execution to the
// next (Note [Blocks above the mmap threshold] in src/runtime/heap.cpp): a
// step whose program needs a 64 MiB temporary, above glibc's largest mmap
// threshold, faults in a small part of those pages once it has run, not
// all of them at every execution. Needs the CPU PJRT plugin of the
// project's environment and skips, saying so, without it.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "strata/runtime/process.h"
#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaHostMemoryTest : public strata::testing::XlaDeviceFixture {};

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

TEST_F(XlaHostMemoryTest, AStepsLargeTemporaryIsNotFaultedInAgainAtEachExecution) {
  // (8192 x 8) @ (8 x 2048): a 64 MiB product the second mm reads, so the
  // program holds it in its temporary arena.
  const at::Tensor x = at::randn({8192, 8});
  const at::Tensor w1 = at::randn({8, 2048}) * 0.1;
  const at::Tensor w2 = at::randn({2048, 8}) * 0.1;
  const at::Tensor expected = x.mm(w1).relu().mm(w2);
  auto step = [&] { return on(x).mm(on(w1)).relu().mm(on(w2)).cpu(); };
  step();  // compiles; the arena's pages are faulted in once
  step();
  const int64_t compiles = metrics().compiles;

  constexpr int kSteps = 3;
  const int64_t before = minor_faults();
  at::Tensor y;
  for (int i = 0; i < kSteps; ++i) y = step();
  const int64_t per_step = (minor_faults() - before) / kSteps;

  const int64_t arena_pages = int64_t{8192} * 2048 * 4 / sysconf(_SC_PAGESIZE);
  EXPECT_TRUE(strata::runtime::large_blocks_kept_in_heap());
  EXPECT_LT(per_step, arena_pages / 8) << "minor page faults per step, against the product's " << arena_pages
                                       << " pages";
  EXPECT_EQ(metrics().compiles, compiles);
  EXPECT_TRUE(at::allclose(y, expected, 1e-4, 1e-4));
}

}  // namespace
