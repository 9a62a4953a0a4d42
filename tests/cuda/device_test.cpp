// On a GPU: placement (cuda:LOCAL_RANK made current, devices=-1, the
// refusal of too many GPUs), the GPU generator's state in activation
// checkpointing and in the Trainer's checkpoint, the device loader's copies
// ordered before the consumer's stream, and strata::optim's fused
// optimizers against torch::optim's loop. Tests that need a GPU skip where
// none is visible; the CPU checkpoint's entries are checked anywhere.
#include <gtest/gtest.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>

#include "cuda/cuda_support.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/data/dataset.h"
#include "strata/data/device_loader.h"
#include "strata/data/loader.h"
#include "strata/fabric/fabric.h"
#include "strata/optim/fused.h"
#include "strata/strategies/accelerator.h"
#include "strata/strategies/recompute.h"
#include "strata/trainer/trainer.h"
#include "support/errors.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

int gpu_count() { return static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()); }

TEST(CudaPlacementTest, AWorkerTrainsOnItsGpuAndMakesItCurrent) {
  STRATA_REQUIRE_GPU();
  Fabric fabric(FabricOptions().with_accelerator("cuda"));
  fabric.launch([](Fabric& f) {
    EXPECT_EQ(f.device(), c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice(), c10::Device(c10::kCUDA, 0));
  });
  auto gpu = strata::strategies::make_accelerator("cuda");
  EXPECT_EQ(strata::strategies::resolve_devices(*gpu, -1), gpu_count());
}

TEST(CudaPlacementTest, AskingForMoreGpusThanThereAreIsRefusedBeforeAnyWorkerStarts) {
  STRATA_REQUIRE_GPU();
  const int n = gpu_count();
  const std::string what = strata::testing::error_message<strata::ConfigError>(
      [&] { strata::Trainer(strata::TrainerOptions().with_accelerator("cuda").with_devices(n + 1)); });
  const std::string expected = "[accelerator] devices=" + std::to_string(n + 1) + " asks for " +
                               std::to_string(n + 1) + " GPUs, but this host has " + std::to_string(n) + " visible";
  EXPECT_EQ(what.rfind(expected, 0), 0u) << what;
}

TEST(CudaRngTest, GpuGeneratorStateRoundTrips) {
  STRATA_REQUIRE_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  at::manual_seed(11);
  at::Tensor state = strata::checkpoint::device_rng_state(gpu);
  EXPECT_EQ(state.device(), c10::Device(c10::kCPU));
  at::Tensor first = at::rand({64}, at::TensorOptions().device(gpu));
  strata::checkpoint::set_device_rng_state(gpu, state, "test");
  EXPECT_TRUE(at::rand({64}, at::TensorOptions().device(gpu)).equal(first));
  const std::string what = strata::testing::error_message<strata::CheckpointError>(
      [&] { strata::checkpoint::set_device_rng_state(gpu, at::zeros({3}, at::kByte), "entry 'rng_cuda'"); });
  EXPECT_EQ(what.rfind("[checkpoint] entry 'rng_cuda': cuda:0 RNG state must be a 1-D uint8 tensor of ", 0), 0u)
      << what;
}

TEST(CudaRngTest, RecomputationReplaysGpuDropout) {
  STRATA_REQUIRE_GPU();
  const auto gpu = at::TensorOptions().device(c10::kCUDA, 0);
  at::manual_seed(3);
  at::Tensor w = at::randn({32, 32}, gpu).requires_grad_();
  at::Tensor x = at::randn({8, 32}, gpu).requires_grad_();
  auto body = [&](const at::Tensor& in) { return at::dropout(at::matmul(in, w).tanh(), 0.5, /*train=*/true); };
  at::manual_seed(5);
  body(x).square().sum().backward();
  at::Tensor plain_w = w.grad().clone(), plain_x = x.grad().clone();
  w.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();
  at::manual_seed(5);
  at::Tensor out = strata::strategies::recomputed_forward(body, x);
  at::Tensor after_forward = at::rand({16}, gpu);  // draws between forward and backward
  out.square().sum().backward();
  EXPECT_TRUE(at::allclose(w.grad(), plain_w)) << "the recomputed dropout mask differs";
  EXPECT_TRUE(at::allclose(x.grad(), plain_x));
  // The recomputation's draws leave no trace in the caller's stream.
  at::manual_seed(5);
  body(x);
  at::Tensor expected_after = at::rand({16}, gpu);
  EXPECT_TRUE(after_forward.equal(expected_after));
}

// A Trainer module: one linear layer regressing random targets.
class TinyModule : public strata::TrainModule {
 public:
  TinyModule() { layer_ = register_module("layer", torch::nn::Linear(4, 1)); }
  at::Tensor training_step(const strata::data::Batch& batch, int64_t) override {
    return (layer_->forward(batch.input.to(at::kFloat)) - batch.target.to(at::kFloat)).square().mean();
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)));
  }

 private:
  torch::nn::Linear layer_{nullptr};
};

std::vector<std::string> checkpoint_entries(const std::string& accelerator, const std::string& dir) {
  std::filesystem::remove_all(dir);
  auto data = std::make_shared<strata::data::TensorDataset>(at::randn({16, 4}), at::randn({16, 1}));
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_accelerator(accelerator)
                              .with_max_steps(2)
                              .with_default_root_dir(dir)
                              .with_enable_checkpointing(false)
                              .with_enable_progress_bar(false));
  auto module = std::make_shared<TinyModule>();
  trainer.fit(module, strata::DataSource(data, strata::DataOptions().with_batch_size(4)));
  const std::string path = dir + "/ckpt";
  trainer.save_checkpoint(path);
  auto reader = strata::checkpoint::CheckpointReader::open(path);
  std::vector<std::string> keys;
  for (const auto& [key, value] : reader.metadata()["entries"].items()) keys.push_back(key);
  std::filesystem::remove_all(dir);
  return keys;
}

TEST(CudaCheckpointTest, ACpuRunSavesTheEntriesItAlwaysSaved) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("strata-cpu-rng-" + std::to_string(::getpid())))
                              .string();
  EXPECT_EQ(checkpoint_entries("cpu", dir),
            (std::vector<std::string>{"module", "optimizer_0", "rng", "trainer"}));
}

TEST(CudaCheckpointTest, AGpuRunAlsoSavesTheGpuGenerator) {
  STRATA_REQUIRE_GPU();
  const std::string dir = (std::filesystem::temp_directory_path() / ("strata-gpu-rng-" + std::to_string(::getpid())))
                              .string();
  EXPECT_EQ(checkpoint_entries("cuda", dir),
            (std::vector<std::string>{"module", "optimizer_0", "rng", "rng_cuda", "trainer"}));
}

TEST(CudaDeviceLoaderTest, BatchesArriveOnTheGpuInOrderOnAnyConsumerStream) {
  STRATA_REQUIRE_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  // Large enough that a copy takes longer than launching the kernels that
  // read it: a consumer stream not ordered after the copy reads stale data.
  at::Tensor inputs = at::arange(24 * 1024 * 256, at::kFloat).view({24, 1024, 256});
  auto data = std::make_shared<strata::data::TensorDataset>(inputs, at::arange(24, at::kLong));
  auto plain = std::make_shared<strata::data::DataLoader>(data, 2);
  strata::data::DeviceLoader loader(plain, gpu, 4);
  c10::impl::VirtualGuardImpl cuda(c10::kCUDA);
  for (bool side_stream : {false, true}) {
    std::optional<c10::StreamGuard> on_side;
    if (side_stream) on_side.emplace(cuda.getStreamFromGlobalPool(gpu));
    int64_t index = 0;
    loader.reset();
    while (std::optional<strata::data::Batch> batch = loader.next()) {
      ASSERT_EQ(batch->input.device(), gpu);
      // Computed on the consumer's current stream, then read back.
      at::Tensor sums = (batch->input * 2).sum({1, 2}).cpu();
      at::Tensor expected = (inputs.narrow(0, index, 2).to(at::kDouble) * 2).sum({1, 2});
      EXPECT_TRUE(at::allclose(sums.to(at::kDouble), expected, 1e-5)) << "batch " << index / 2;
      EXPECT_TRUE(batch->target.cpu().equal(at::arange(index, index + 2, at::kLong)));
      index += 2;
    }
    EXPECT_EQ(index, 24);
  }
}

}  // namespace

namespace {

// strata::optim's fused optimizers on the GPU (ATen's CUDA fused kernels)
// train as torch::optim's loop does, to rounding (Note [Fused against the
// loop]); bf16 and fp32 parameters in one optimizer take one call each.
TEST(CudaFusedOptimizerTest, FusedAdamWAndSgdOnTheGpuMatchTheLoop) {
  STRATA_REQUIRE_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  for (const bool sgd : {false, true}) {
    torch::manual_seed(11);
    at::Tensor w = torch::randn({256, 64}, at::device(gpu)).requires_grad_();
    at::Tensor h = torch::randn({64}, at::device(gpu)).to(at::kBFloat16).requires_grad_();
    at::Tensor rw = w.detach().clone().requires_grad_(), rh = h.detach().clone().requires_grad_();
    std::unique_ptr<torch::optim::Optimizer> fused, loop;
    if (sgd) {
      const auto o = torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3);
      fused = std::make_unique<strata::optim::SGD>(std::vector<at::Tensor>{w, h}, o);
      loop = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{rw, rh}, o);
    } else {
      const auto o = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
      fused = std::make_unique<strata::optim::AdamW>(std::vector<at::Tensor>{w, h}, o);
      loop = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{rw, rh}, o);
    }
    const at::Tensor x = torch::randn({32, 256}, at::device(gpu));
    for (int step = 0; step < 20; ++step) {
      fused->zero_grad();
      loop->zero_grad();
      (at::tanh(x.matmul(w)) * h.to(at::kFloat)).pow(2).mean().backward();
      (at::tanh(x.matmul(rw)) * rh.to(at::kFloat)).pow(2).mean().backward();
      fused->step();
      loop->step();
    }
    const double scale = rw.abs().max().item<double>();
    EXPECT_LT((w - rw).abs().max().item<double>(), 1e-5 * scale) << (sgd ? "sgd" : "adamw");
    EXPECT_LE((h.to(at::kFloat) - rh.to(at::kFloat)).abs().max().item<double>(), 2e-2) << (sgd ? "sgd" : "adamw");
    EXPECT_EQ(w.device(), gpu);
  }
}

}  // namespace
