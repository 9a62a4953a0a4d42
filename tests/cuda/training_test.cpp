// DDP and FSDP on a GPU train exactly as one device does: the tiny GPT on
// one GPU through the single-device strategy, DDP and FSDP at world size 1
// (with and without activation checkpointing, with dropout, in fp32 and
// bf16-mixed), and on two ranks sharing the GPU (Note [Two ranks on one
// GPU]). Every test skips where no GPU is visible.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>

#include "cuda/cuda_support.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/comm/backend.h"
#include "strata/comm/group.h"
#include "strata/data/dataset.h"
#include "strata/data/loader.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/strategies/accelerator.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/single_device.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

struct GptRun {
  std::vector<double> losses;
  strata::checkpoint::NamedTensors params;  // full values, on the CPU
  std::vector<std::string> shard_devices;   // FSDP: where the shards live
  std::vector<c10::ScalarType> shard_dtypes;
};

// Random byte "text": 64 windows of 16 tokens, the same in every process.
std::shared_ptr<strata::data::TensorDataset> make_dataset() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor tokens = at::randint(0, 256, {64, 17}, gen, at::kLong);
  return std::make_shared<strata::data::TensorDataset>(tokens.narrow(1, 0, 16).contiguous(),
                                                       tokens.narrow(1, 1, 16).contiguous());
}

// The tiny GPT, SGD with momentum (Note in tests/fabric/equivalence_test.cpp:
// not Adam, which turns rounding noise of zero gradients into full steps),
// batches through the distributed sampler and the device loader.
GptRun train(Fabric& fabric, int64_t steps, int64_t global_batch, double dropout) {
  Fabric::seed_everything(1234);
  strata::models::GPT model(strata::models::GPTConfig::preset("tiny").with_block_size(16).with_dropout(dropout));
  fabric.setup_module(model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  fabric.setup_optimizer(optimizer);
  auto dataset = make_dataset();
  const int world = fabric.world_size();
  strata::data::DistributedSampler sampler(dataset->size(), world, fabric.global_rank(), true, 99);
  auto loader = std::make_shared<strata::data::DataLoader>(dataset, sampler, global_batch / world, true);
  auto batches = fabric.setup_dataloader(loader);
  batches->reset();
  GptRun run;
  for (int64_t step = 0; step < steps; ++step) {
    std::optional<strata::data::Batch> batch = batches->next();
    if (!batch) {
      batches->reset();
      batch = batches->next();
    }
    EXPECT_EQ(batch->input.device(), fabric.device());
    at::Tensor loss;
    {
      auto autocast = fabric.autocast();  // bf16-mixed: the forward in bf16
      loss = model->loss(batch->input, batch->target);
    }
    fabric.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    run.losses.push_back(fabric.all_reduce(loss.detach()).item<double>());
  }
  auto* fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric.strategy());
  for (auto& [name, tensor] : strata::checkpoint::module_state(*model)) {
    const bool is_param = model->named_parameters().contains(name);
    at::Tensor full = fsdp && is_param ? fsdp->full_parameter(name) : tensor.detach();
    run.params.emplace_back(name, full.cpu().clone());
    if (fsdp && is_param) {
      run.shard_devices.push_back(tensor.device().str());
      run.shard_dtypes.push_back(tensor.scalar_type());
    }
  }
  return run;
}

std::shared_ptr<strata::strategies::Strategy> make_strategy(const std::string& accelerator, const std::string& spec,
                                                           const std::string& precision) {
  using namespace strata::strategies;
  auto gpu = make_accelerator(accelerator);
  auto fp = Precision::parse(precision, gpu->name());
  if (spec == "single_device") return std::make_shared<SingleDeviceStrategy>(gpu, fp);
  if (spec == "ddp") return std::make_shared<DDPStrategy>(gpu, fp);
  FSDPOptions options;
  options.with_auto_wrap_policy(ModuleTypes{"Block"});
  if (spec == "fsdp-ac") options.with_activation_checkpointing_policy({"Block"});
  return std::make_shared<FSDPStrategy>(gpu, fp, options);
}

GptRun train_on(const std::string& accelerator, const std::string& spec, double dropout,
                const std::string& precision = "32-true") {
  Fabric fabric(FabricOptions().with_accelerator(accelerator).with_strategy(make_strategy(accelerator, spec, precision)));
  GptRun run;
  fabric.launch([&](Fabric& f) { run = train(f, 8, 8, dropout); });
  return run;
}

void expect_same_training(const GptRun& got, const GptRun& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(got.losses.size(), expected.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], expected.losses[i], tolerance) << what << ", step " << i + 1;
  }
  ASSERT_EQ(got.params.size(), expected.params.size()) << what;
  for (size_t i = 0; i < got.params.size(); ++i) {
    EXPECT_EQ(got.params[i].first, expected.params[i].first) << what;
    EXPECT_TRUE(at::allclose(got.params[i].second, expected.params[i].second, tolerance, tolerance))
        << what << ": " << got.params[i].first << " differs by "
        << (got.params[i].second - expected.params[i].second).abs().max().item<double>();
  }
}

TEST(CudaTrainingTest, DdpAndFsdpOnOneGpuEqualSingleDeviceTraining) {
  STRATA_REQUIRE_GPU();
  for (double dropout : {0.0, 0.1}) {
    const GptRun single = train_on("cuda", "single_device", dropout);
    EXPECT_GT(std::abs(single.losses.back() - single.losses.front()), 1e-3) << "the reference did not train";
    // At world size 1 DDP's mean over ranks and FSDP's gather/scatter are
    // copies: the same kernels run in the same order.
    expect_same_training(train_on("cuda", "ddp", dropout), single, 1e-6, "ddp, dropout " + std::to_string(dropout));
    GptRun fsdp = train_on("cuda", "fsdp", dropout);
    expect_same_training(fsdp, single, 1e-5, "fsdp, dropout " + std::to_string(dropout));
    for (const std::string& device : fsdp.shard_devices) EXPECT_EQ(device, "cuda:0");
    // The recomputation replays the GPU generator (Note [Replaying the
    // forward]): with dropout the recomputed activations are the same.
    expect_same_training(train_on("cuda", "fsdp-ac", dropout), single, 1e-5,
                         "fsdp with activation checkpointing, dropout " + std::to_string(dropout));
  }
}

TEST(CudaTrainingTest, Bf16MixedKeepsFp32ShardsAndTrainsLikeSingleDevice) {
  STRATA_REQUIRE_GPU();
  const GptRun single = train_on("cuda", "single_device", 0.0, "bf16-mixed");
  const GptRun fsdp = train_on("cuda", "fsdp", 0.0, "bf16-mixed");
  ASSERT_FALSE(fsdp.shard_dtypes.empty());
  for (c10::ScalarType dtype : fsdp.shard_dtypes) EXPECT_EQ(dtype, c10::kFloat);
  for (const auto& [name, value] : fsdp.params) EXPECT_EQ(value.scalar_type(), c10::kFloat) << name;
  // FSDP gathers bf16 copies of fp32 shards where autocast casts fp32
  // parameters: the same bf16 values, summed in another order.
  expect_same_training(fsdp, single, 2e-2, "fsdp bf16-mixed");
}

TEST(CudaTrainingTest, GpuTrainingAgreesWithCpuTraining) {
  STRATA_REQUIRE_GPU();
  Fabric cpu(FabricOptions().with_strategy("single_device"));
  GptRun on_cpu;
  cpu.launch([&](Fabric& f) { on_cpu = train(f, 8, 8, 0.0); });
  // Other kernels (and no TF32: LibTorch leaves it off for matmuls).
  expect_same_training(train_on("cuda", "single_device", 0.0), on_cpu, 1e-3, "gpu vs cpu");
}

// ---- two ranks on one GPU ------------------------------------------------------

// Note [Two ranks on one GPU]
// NCCL refuses two ranks on one GPU (a communicator needs a device of its
// own), and the CPU backends (gloo, shm) take CPU tensors only. To run DDP
// and FSDP on two ranks sharing the one GPU of a test machine, the workers
// start with STRATA_COMM_BACKEND=gloo and CUDA_VISIBLE_DEVICES=0 (so both
// train on cuda:0, Note [Device placement]), and replace their strategy's
// group with this backend, which stages every CUDA tensor through the
// host: a copy to the CPU, the collective over the gloo group, a copy back.
// Slow, but the strategies see CUDA tensors end to end.
class HostStagedBackend : public strata::comm::Backend {
 public:
  explicit HostStagedBackend(strata::comm::Group host) : host_(std::move(host)) {}
  std::string name() const override { return "host-staged+" + host_.backend_name(); }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::chrono::milliseconds timeout() const override { return std::chrono::minutes(2); }
  void all_reduce(at::Tensor& tensor, strata::comm::ReduceOp op) override {
    at::Tensor host = tensor.cpu();
    host_.all_reduce(host, op);
    tensor.copy_(host);
  }
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    at::Tensor host = at::empty(output.sizes(), output.options().device(at::kCPU));
    host_.all_gather(input.cpu(), host);
    output.copy_(host);
  }
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, strata::comm::ReduceOp op) override {
    at::Tensor host = at::empty(output.sizes(), output.options().device(at::kCPU));
    host_.reduce_scatter(input.cpu(), host, op);
    output.copy_(host);
  }
  void broadcast(at::Tensor& tensor, int src) override {
    at::Tensor host = tensor.cpu();
    host_.broadcast(host, src);
    tensor.copy_(host);
  }
  void barrier() override { host_.barrier("host-staged"); }

 private:
  strata::comm::Group host_;
};

STRATA_WORKER(two_ranks_one_gpu) {
  const std::string out = args.at(0);
  Fabric fabric(FabricOptions().with_accelerator(args.at(2)).with_strategy(make_strategy(args.at(2), args.at(1), "32-true"))
                    .with_collective_timeout(std::chrono::minutes(2)));
  GptRun run;
  fabric.launch([&](Fabric& f) {
    strata::comm::Group& group = f.strategy().group();
    group = strata::comm::Group(std::make_shared<HostStagedBackend>(group));
    run = train(f, 8, 8, 0.0);
  });
  if (fabric.is_global_zero()) {
    std::ofstream(out + ".losses") << nlohmann::json(run.losses).dump();
    strata::checkpoint::write_safetensors(out + ".params", run.params);
  }
  return 0;
}

// Two ranks on `accelerator` (Note [Two ranks on one GPU]) against one
// device, for DDP and FSDP.
void expect_two_ranks_train_as_one(const std::string& accelerator) {
  const GptRun single = train_on(accelerator, "single_device", 0.0);
  for (const std::string spec : {"ddp", "fsdp"}) {
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("strata-cuda-two-" + std::to_string(::getpid()) + "-" + spec))
                                .string();
    strata::runtime::LaunchOptions options = strata::runtime::LaunchOptions().with_timeout_s(240);
    options.extra_env["STRATA_COMM_BACKEND"] = "gloo";
    options.extra_env["CUDA_VISIBLE_DEVICES"] = "0";
    auto result = strata::testing::run_workers(2, "two_ranks_one_gpu", {out, spec, accelerator}, options);
    ASSERT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
    GptRun two;
    two.losses = nlohmann::json::parse(std::ifstream(out + ".losses")).get<std::vector<double>>();
    auto file = strata::checkpoint::SafetensorsFile::open(out + ".params");
    for (const auto& [name, value] : single.params) two.params.emplace_back(name, file.load(name));
    // Per-rank means, then the mean of means: the last bits differ.
    expect_same_training(two, single, 1e-4, spec + " on two ranks sharing one " + accelerator + " device");
    std::filesystem::remove(out + ".losses");
    std::filesystem::remove(out + ".params");
  }
}

TEST(CudaTrainingTest, TwoRanksSharingOneGpuEqualSingleDeviceTraining) {
  STRATA_REQUIRE_GPU();
  expect_two_ranks_train_as_one("cuda");
}

// The same checks on the CPU, where they run everywhere: the training
// helper, the strategies' agreement with dropout (activation checkpointing
// replays the CPU generator), and the host-staged backend (a pass-through
// for CPU tensors) on two ranks.
TEST(CudaTrainingTest, OnTheCpuTheSameChecksHold) {
  const GptRun single = train_on("cpu", "single_device", 0.1);
  EXPECT_GT(std::abs(single.losses.back() - single.losses.front()), 1e-3) << "the reference did not train";
  expect_same_training(train_on("cpu", "ddp", 0.1), single, 1e-6, "cpu ddp");
  expect_same_training(train_on("cpu", "fsdp", 0.1), single, 1e-5, "cpu fsdp");
  expect_same_training(train_on("cpu", "fsdp-ac", 0.1), single, 1e-5, "cpu fsdp with activation checkpointing");
  expect_two_ranks_train_as_one("cpu");
}

}  // namespace
