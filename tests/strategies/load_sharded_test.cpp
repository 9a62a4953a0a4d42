// Strategies whose ranks hold whole modules (DDP, single device) load the
// sharded checkpoints of the fully-sharded strategy, saved at any world
// size: the shards are written rank file by rank file with the library,
// loaded through Strategy::load_checkpoint in one process (world size 1),
// and the module, the optimizer and the values must equal the saved ones.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <memory>

#include "checkpoint/sharded_util.h"
#include "checkpoint/test_util.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/single_device.h"
#include "support/errors.h"

namespace strata::strategies {
namespace {

using checkpoint::NamedTensors;

// Parameters of several shapes (a 0-d one, one smaller than the world),
// a child module, and buffers that a sharded checkpoint keeps whole.
struct Head : torch::nn::Module {
  Head() {
    weight = register_parameter("weight", at::randn({2, 5}));
    bias = register_parameter("bias", at::randn({2}));
  }
  at::Tensor weight, bias;
};

struct Net : torch::nn::Module {
  Net() {
    weight = register_parameter("weight", at::randn({5, 3}));
    scale = register_parameter("scale", at::randn({}));
    head = register_module("head", std::make_shared<Head>());
    count = register_buffer("count", at::randint(0, 100, {3}, at::kLong));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::matmul(at::tanh(at::matmul(x, weight.t()) * scale), head->weight.t()) + head->bias;
  }
  at::Tensor weight, scale, count;
  std::shared_ptr<Head> head;
};

void sgd_step(Net& net, torch::optim::SGD& sgd, const at::Tensor& x) {
  sgd.zero_grad();
  net.forward(x).pow(2).sum().backward();
  sgd.step();
}

torch::optim::SGDOptions sgd_options(double lr) { return torch::optim::SGDOptions(lr).momentum(0.9); }

class LoadShardedTest : public checkpoint::testing::ScratchDir {};

// Saves `net` and `sgd` as the fully-sharded strategy would for `world`
// ranks: parameters and momentum sharded, buffers and the tensor entry whole.
void save_sharded(const std::string& path, int world, const Net& net, const torch::optim::SGD& sgd,
                  const at::Tensor& extra_tensor) {
  NamedTensors tensors;
  std::set<std::string> whole;
  for (const auto& item : net.named_parameters()) tensors.emplace_back("model/" + item.key(), item.value());
  for (const auto& item : net.named_buffers()) {
    tensors.emplace_back("model/" + item.key(), item.value());
    whole.insert("model/" + item.key());
  }
  checkpoint::OptimizerState optim = checkpoint::optimizer_state(sgd, checkpoint::param_names(net));
  for (const auto& [name, tensor] : optim.tensors) tensors.emplace_back("optimizer/" + name, tensor);
  tensors.emplace_back("noise", extra_tensor);
  whole.insert("noise");
  nlohmann::json extra = {{"strategy", "fsdp"},
                          {"entries",
                           {{"model", {{"kind", "module"}}},
                            {"optimizer", {{"kind", "optimizer"}, {"state", optim.json}}},
                            {"noise", {{"kind", "tensor"}}},
                            {"step", {{"kind", "value"}, {"value", 7}}}}}};
  checkpoint::testing::write_sharded_by_rank(path, world, tensors, whole, extra);
}

TEST_F(LoadShardedTest, DdpAndSingleDeviceLoadShardsSavedAtAnyWorldSize) {
  at::manual_seed(3);
  Net saved;
  torch::optim::SGD saved_sgd(saved.parameters(), sgd_options(0.05));
  const at::Tensor x = at::randn({4, 3});
  sgd_step(saved, saved_sgd, x);
  sgd_step(saved, saved_sgd, x);
  const at::Tensor noise = at::randn({2, 2});

  for (int world : {2, 3, 8}) {
    const std::string ckpt = path("ckpt-" + std::to_string(world));
    save_sharded(ckpt, world, saved, saved_sgd, noise);
    for (bool ddp : {true, false}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ddp ? ", ddp" : ", single_device"));
      std::unique_ptr<Strategy> strategy;
      if (ddp)
        strategy = std::make_unique<DDPStrategy>();
      else
        strategy = std::make_unique<SingleDeviceStrategy>();

      at::manual_seed(100 + world);  // different initial values
      auto loaded = std::make_shared<Net>();
      torch::optim::SGD loaded_sgd(loaded->parameters(), sgd_options(0.5));
      at::Tensor loaded_noise = at::zeros({2, 2});
      State state{{"model", ModulePtr(loaded)}, {"optimizer", loaded_sgd}, {"noise", loaded_noise}, {"step", 0}};
      nlohmann::json rest = strategy->load_checkpoint(ckpt, state);
      EXPECT_TRUE(rest.empty()) << rest.dump();

      EXPECT_EQ(state.at("step").get<int>(), 7);
      EXPECT_TRUE(at::equal(loaded_noise, noise));
      for (const auto& item : saved.named_parameters())
        EXPECT_TRUE(at::equal(loaded->named_parameters()[item.key()], item.value())) << item.key();
      EXPECT_TRUE(at::equal(loaded->count, saved.count));
      EXPECT_EQ(static_cast<const torch::optim::SGDOptions&>(loaded_sgd.param_groups()[0].options()).lr(), 0.05);

      // The momentum came back too: one more step agrees bit for bit with
      // the saved run's next step.
      Net next_saved;
      {
        torch::NoGradGuard no_grad;
        for (const auto& item : saved.named_parameters()) next_saved.named_parameters()[item.key()].copy_(item.value());
      }
      torch::optim::SGD next_sgd(next_saved.parameters(), sgd_options(0.05));
      checkpoint::load_optimizer_state(next_sgd, checkpoint::param_names(next_saved),
                                       checkpoint::optimizer_state(saved_sgd, checkpoint::param_names(saved)));
      sgd_step(next_saved, next_sgd, x);
      sgd_step(*loaded, loaded_sgd, x);
      for (const auto& item : next_saved.named_parameters())
        EXPECT_TRUE(at::equal(loaded->named_parameters()[item.key()], item.value())) << item.key();
    }
  }
}

TEST_F(LoadShardedTest, ShapeMismatchAndMissingShardKeepTheirMessages) {
  at::manual_seed(5);
  Net saved;
  torch::optim::SGD saved_sgd(saved.parameters(), sgd_options(0.1));
  sgd_step(saved, saved_sgd, at::randn({2, 3}));
  save_sharded(path("ckpt"), 2, saved, saved_sgd, at::zeros({1}));

  DDPStrategy strategy;
  auto other = std::make_shared<torch::nn::Module>();
  other->register_parameter("weight", at::zeros({3, 5}));
  State state{{"model", other}};
  const std::string what = strata::testing::error_message<CheckpointError>(
      [&] { strategy.load_checkpoint(path("ckpt"), state, /*strict=*/false); });
  EXPECT_EQ(what, "[checkpoint] " + path("ckpt") + " entry 'model': key 'weight' has shape [5, 3] but the module's "
                  "has shape [3, 5]");

  std::filesystem::remove(path("ckpt/shard-00001-of-00002.safetensors"));
  EXPECT_EQ(strata::testing::error_message<CheckpointError>([&] { strategy.load_checkpoint(path("ckpt"), state); }),
            "[checkpoint] " + path("ckpt") + ": shard-00001-of-00002.safetensors is missing (rank 1 of 2 did not save?)");
}

}  // namespace
}  // namespace strata::strategies
