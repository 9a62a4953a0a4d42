// What the strategies' shared parts promise across ranks and options: a
// failed save is reported on every rank (not left at a barrier), and
// Fabric's precision reaches a strategy object it is handed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::DDPStrategy;
using strata::testing::Checks;
using strata::testing::contains;

// Rank 0 cannot start the save (the checkpoint's parent is a file); every
// rank must get the same CheckpointError naming rank 0, long before the
// collective timeout (20 s here) would end a rank waiting for it.
STRATA_WORKER(ddp_save_failure_everywhere) {
  const std::filesystem::path blocker = args.at(0);
  auto strategy = std::make_shared<DDPStrategy>();
  strategy->set_collective_timeout(std::chrono::seconds(20));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    torch::nn::Linear model(3, 2);
    f.setup_module(model);
    std::string what;
    bool checkpoint_error = false;
    try {
      f.save((blocker / "ckpt").string(), {{"model", model}, {"step", 3}});
    } catch (const strata::CheckpointError& e) {
      checkpoint_error = true;
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
    c.expect(checkpoint_error, "a CheckpointError on every rank, got: " + what);
    c.expect(contains(what, "[ddp] starting the save to ") && contains(what, "failed on rank 0"),
             "the error names the step and rank 0: " + what);
    // The group is still usable: the failure did not leave a collective half done.
    c.expect(f.all_reduce(at::ones({1}), "sum").item<double>() == f.world_size(), "collectives still work");
  });
  return c.result();
}

TEST(StrategyOptionsTest, ADdpSaveThatFailsOnRankZeroFailsOnEveryRank) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("strata-save-failure-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::path blocker = dir / "not-a-directory";
  std::ofstream(blocker) << "a file where the checkpoint's parent directory should be";
  auto run = strata::testing::run_workers(2, "ddp_save_failure_everywhere", {blocker.string()});
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(StrategyOptionsTest, FabricPrecisionReachesAStrategyObject) {
  auto ddp = std::make_shared<DDPStrategy>();
  EXPECT_EQ(ddp->precision().name(), "32-true");
  Fabric fabric(FabricOptions().with_precision("bf16-mixed").with_strategy(ddp));
  EXPECT_EQ(fabric.strategy().precision().name(), "bf16-mixed");
  EXPECT_EQ(ddp->precision().compute_dtype(), c10::kBFloat16);
  EXPECT_TRUE(fabric.strategy().precision().autocast());

  // The same for FSDP, whose compute dtype follows the precision.
  auto fsdp = std::make_shared<strata::strategies::FSDPStrategy>();
  Fabric sharded(FabricOptions().with_precision("bf16-mixed").with_strategy(fsdp));
  EXPECT_EQ(fsdp->precision().name(), "bf16-mixed");

  // A strategy object built with its own precision keeps it when Fabric is
  // given none; an explicit Fabric precision wins, as in Lightning.
  auto own = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(),
                                           strata::strategies::Precision::parse("bf16-mixed"));
  Fabric keeps(FabricOptions().with_strategy(own));
  EXPECT_EQ(own->precision().name(), "bf16-mixed");
  auto overridden = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(),
                                                  strata::strategies::Precision::parse("bf16-mixed"));
  Fabric wins(FabricOptions().with_precision("32-true").with_strategy(overridden));
  EXPECT_EQ(overridden->precision().name(), "32-true");
  EXPECT_FALSE(overridden->precision().autocast());
}

}  // namespace
