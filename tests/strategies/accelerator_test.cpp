// Device placement without a GPU: how many workers devices=N or -1 means
// for a given number of visible GPUs, which GPU each local rank uses, the
// refusals and their messages, and the device-generic generator state.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/strategies/accelerator.h"
#include "support/errors.h"

namespace {

using strata::ConfigError;
using strata::strategies::cuda_device_index;
using strata::strategies::resolve_devices;
using strata::testing::error_message;

TEST(AcceleratorTest, MinusOneMeansEveryVisibleGpu) {
  EXPECT_EQ(resolve_devices("cuda", -1, 1), 1);
  EXPECT_EQ(resolve_devices("cuda", -1, 8), 8);
  EXPECT_EQ(resolve_devices("cuda", -1, 3, "0,2,5"), 3);
  EXPECT_EQ(resolve_devices("cuda", 2, 8), 2);
  EXPECT_EQ(resolve_devices("cuda", 8, 8), 8);
}

TEST(AcceleratorTest, CpuWorkersAreProcessesAndMinusOneIsOne) {
  EXPECT_EQ(resolve_devices("cpu", -1, 1), 1);
  EXPECT_EQ(resolve_devices("cpu", 4, 1), 4);
  EXPECT_EQ(resolve_devices("CPU", 64, 0), 64);
}

TEST(AcceleratorTest, MoreGpusThanVisibleIsRefusedWithTheCount) {
  EXPECT_EQ(error_message<ConfigError>([] { resolve_devices("cuda", 4, 1, nullptr); }),
            "[accelerator] devices=4 asks for 4 GPUs, but this host has 1 visible (CUDA_VISIBLE_DEVICES is "
            "unset); ask for at most 1, or -1 for all of them");
  EXPECT_EQ(error_message<ConfigError>([] { resolve_devices("cuda", 3, 2, "1,3"); }),
            "[accelerator] devices=3 asks for 3 GPUs, but this host has 2 visible (CUDA_VISIBLE_DEVICES='1,3'); "
            "ask for at most 2, or -1 for all of them");
  EXPECT_EQ(error_message<ConfigError>([] { resolve_devices("cuda", -1, 0, ""); }),
            "[accelerator] devices=-1 on 'cuda', but this process sees no GPU (CUDA_VISIBLE_DEVICES=''); check "
            "nvidia-smi and CUDA_VISIBLE_DEVICES, or use accelerator 'cpu'");
  EXPECT_EQ(error_message<ConfigError>([] { resolve_devices("cuda", 0, 4); }),
            "[accelerator] devices must be >= 1 (or -1 for every visible device), got 0");
  EXPECT_EQ(error_message<ConfigError>([] { resolve_devices("cpu", -2, 1); }),
            "[accelerator] devices must be >= 1 (or -1 for every visible device), got -2");
}

TEST(AcceleratorTest, LocalRankIndexesTheVisibleGpusUnchanged) {
  // CUDA_VISIBLE_DEVICES=2,3: local rank 1 is cuda:1 (physical GPU 3, as
  // the CUDA runtime maps it); strata never re-maps.
  EXPECT_EQ(cuda_device_index(0, 2, "2,3"), 0);
  EXPECT_EQ(cuda_device_index(1, 2, "2,3"), 1);
  EXPECT_EQ(cuda_device_index(3, 8, nullptr), 3);
  EXPECT_EQ(cuda_device_index(0, 1, nullptr), 0);
}

TEST(AcceleratorTest, AWorkerGivenItsOwnGpuUsesCudaZero) {
  // A launcher that isolates each worker (SLURM --gpus-per-task=1) leaves
  // one visible GPU per process, whatever the local rank.
  EXPECT_EQ(cuda_device_index(3, 1, "5"), 0);
  EXPECT_EQ(cuda_device_index(1, 1, "GPU-8f6c1a2e-0000-0000-0000-000000000000"), 0);
}

TEST(AcceleratorTest, ALocalRankPastTheVisibleGpusIsRefused) {
  EXPECT_EQ(error_message<ConfigError>([] { cuda_device_index(2, 2, "0,1"); }),
            "[accelerator] local rank 2 would train on cuda:2, but this process sees 2 GPUs (cuda:0..cuda:1; "
            "CUDA_VISIBLE_DEVICES='0,1'); start at most 2 workers per host, or give each worker one GPU with "
            "CUDA_VISIBLE_DEVICES");
  // One GPU visible but not chosen for this worker (no CUDA_VISIBLE_DEVICES).
  EXPECT_EQ(error_message<ConfigError>([] { cuda_device_index(1, 1, nullptr); }),
            "[accelerator] local rank 1 would train on cuda:1, but this process sees 1 GPU (cuda:0..cuda:0; "
            "CUDA_VISIBLE_DEVICES is unset); start at most 1 worker per host, or give each worker one GPU with "
            "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(error_message<ConfigError>([] { cuda_device_index(0, 0, "-1"); }),
            "[accelerator] local rank 0 trains on a GPU, but this process sees none (CUDA_VISIBLE_DEVICES='-1'); "
            "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use accelerator 'cpu'");
}

TEST(AcceleratorTest, CudaIsRefusedWhereThereIsNone) {
  if (at::hasCUDA()) GTEST_SKIP() << "a GPU is visible: the refusal is for machines without one";
  const std::string what = error_message<ConfigError>([] { strata::strategies::make_accelerator("cuda"); });
  EXPECT_TRUE(what.rfind("[accelerator] 'cuda' asked for, but ", 0) == 0) << what;
  EXPECT_TRUE(what.find("use accelerator 'cpu'") != std::string::npos) << what;
  EXPECT_EQ(strata::strategies::make_accelerator("auto")->name(), "cpu");
  // The CPU accelerator: one worker for -1, no current device to set.
  auto cpu = strata::strategies::cpu_accelerator();
  EXPECT_EQ(resolve_devices(*cpu, -1), 1);
  EXPECT_EQ(resolve_devices(*cpu, 3), 3);
  strata::strategies::set_current_device(cpu->device(0));
}

TEST(AcceleratorTest, DeviceRngStateOfTheCpuIsTheCpuGenerator) {
  const c10::Device cpu(c10::kCPU);
  at::manual_seed(7);
  at::Tensor saved = strata::checkpoint::device_rng_state(cpu);
  EXPECT_TRUE(saved.equal(strata::checkpoint::cpu_rng_state()));
  at::Tensor first = at::rand({5});
  strata::checkpoint::set_device_rng_state(cpu, saved, "test");
  EXPECT_TRUE(at::rand({5}).equal(first));
  const std::string what = error_message<strata::CheckpointError>(
      [&] { strata::checkpoint::set_device_rng_state(cpu, at::zeros({3}, at::kByte), "ckpt entry 'rng'"); });
  EXPECT_EQ(what, "[checkpoint] ckpt entry 'rng': CPU RNG state must be a 1-D uint8 tensor of " +
                      std::to_string(saved.numel()) + " bytes, got Byte [3]");
}

// The bf16 check agrees with what the kernel reports in /proc/cpuinfo.
TEST(AcceleratorTest, NativeBf16MatchesTheCpuFlagsTheKernelReports) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
#if defined(__x86_64__) || defined(__i386__)
  const bool expected = flags.count("avx512_bf16") || flags.count("amx_bf16");
#elif defined(__aarch64__)
  const bool expected = flags.count("bf16") > 0;
#else
  const bool expected = false;
#endif
  EXPECT_EQ(strata::strategies::cpu_has_native_bf16(), expected);
}

}  // namespace
