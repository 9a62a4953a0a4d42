// The model zoo (tests/support/zoo/), unchanged, under `ddp`, under `fsdp`
// with a unit per block type (TransformerBlock, BasicBlock, EncoderBlock,
// LSTM, GRU, FNetLayer; the DCGAN's convolutions) and under `fsdp` with those blocks
// checkpointed, at 2 and 3 workers: each model trains as one process does on the whole batch (losses,
// then every parameter and buffer), and under fsdp each rank holds 1/N of
// every parameter. BatchNorm layers normalise over the global batch
// (sync_batchnorm), so the ResNet is compared with one process too. The
// MNIST net trains in eval mode: its dropout would draw other masks on
// other ranks. The models' sources hold no strata call.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"
#include "support/zoo/dcgan.h"
#include "support/zoo/fnet.h"
#include "support/zoo/llama.h"
#include "support/zoo/mnist.h"
#include "support/zoo/resnet.h"
#include "support/zoo/rnn_lm.h"
#include "support/zoo/vit.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::testing::Checks;

constexpr int64_t kBatch = 6;  // divides into 2 and 3 ranks
constexpr int kSteps = 3;

/// One zoo model: how to build it (from a fixed seed), run it, and its batch
/// and loss.
struct ZooCase {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward;
  std::pair<at::Tensor, at::Tensor> batch;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;
};

template <class Impl>
std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward_of() {
  return [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<Impl&>(m).forward(x); };
}

std::vector<ZooCase> zoo_cases() {
  const zoo::llama::ModelArgs llama;
  const zoo::vit::ViTConfig vit;
  const zoo::rnn_lm::RNNConfig rnn;
  const zoo::fnet::FNetConfig fnet;
  return {
      {"mnist",
       [] {
         auto net = std::make_shared<zoo::mnist::Net>();
         net->eval();
         return net;
       },
       forward_of<zoo::mnist::Net>(), zoo::mnist::batch(kBatch), zoo::mnist::loss},
      {"llama", [llama] { return zoo::llama::Transformer(llama).ptr(); }, forward_of<zoo::llama::TransformerImpl>(),
       zoo::llama::batch(llama, kBatch), zoo::llama::loss},
      {"resnet", [] { return zoo::resnet::ResNet(std::vector<int64_t>{1, 1}).ptr(); },
       forward_of<zoo::resnet::ResNetImpl>(), zoo::resnet::batch(kBatch), zoo::resnet::loss},
      {"vit", [vit] { return zoo::vit::VisionTransformer(vit).ptr(); }, forward_of<zoo::vit::VisionTransformerImpl>(),
       zoo::vit::batch(vit, kBatch), zoo::vit::loss},
      {"lstm", [rnn] { return zoo::rnn_lm::LSTMModel(rnn).ptr(); }, forward_of<zoo::rnn_lm::LSTMModelImpl>(),
       zoo::rnn_lm::batch(rnn, kBatch), zoo::rnn_lm::loss},
      {"gru", [rnn] { return zoo::rnn_lm::GRUModel(rnn).ptr(); }, forward_of<zoo::rnn_lm::GRUModelImpl>(),
       zoo::rnn_lm::batch(rnn, kBatch), zoo::rnn_lm::loss},
      {"fnet", [fnet] { return zoo::fnet::FNetForSequenceClassification(fnet).ptr(); },
       forward_of<zoo::fnet::FNetForSequenceClassificationImpl>(), zoo::fnet::batch(fnet, kBatch), zoo::fnet::loss},
  };
}

const strata::strategies::ModuleTypes kBlocks{"TransformerBlock", "BasicBlock", "EncoderBlock", "LSTM", "GRU",
                                              "FNetLayer"};

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> state;  // full parameters and buffers after training
};

// Trains kSteps on this rank's rows of the batch (all of them without `fabric`).
Trained train(const ZooCase& zc, Fabric* fabric, Checks* c) {
  at::manual_seed(11);
  std::shared_ptr<torch::nn::Module> model = zc.build();
  std::map<std::string, int64_t> full_numel;
  for (const auto& item : model->named_parameters()) full_numel[item.key()] = item.value().numel();
  strata::strategies::FSDPStrategy* fsdp = nullptr;
  if (fabric) {
    fabric->setup_module(model);
    fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric->strategy());
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (fabric) fabric->setup_optimizer(optimizer);
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  const at::Tensor input = zc.batch.first.chunk(world)[rank], target = zc.batch.second.chunk(world)[rank];
  Trained out;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor loss = zc.loss(zc.forward(*model, input), target);
    if (fabric) {
      fabric->backward(loss);
      loss = fabric->all_reduce(loss.detach());
    } else {
      loss.backward();
    }
    optimizer.step();
    optimizer.zero_grad();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) {
    if (fsdp) {
      // 1/N of every parameter on this rank.
      const int64_t held = item.value().numel(), full = full_numel[item.key()];
      c->expect(held == (full + world - 1) / world, zc.name + ": " + item.key() + " holds " + std::to_string(held) +
                                                        " of " + std::to_string(full));
    }
    out.state[item.key()] = fsdp ? fsdp->full_parameter(*model, item.key()) : item.value().detach().clone();
  }
  for (const auto& item : model->named_buffers()) out.state[item.key()] = item.value().detach().clone();
  if (fabric) fabric->barrier();
  return out;
}

// Every loss to 1e-5 (relative, at least absolute), then every parameter
// and buffer to allclose(1e-4, 1e-5); `what` names the run in messages.
void expect_as_one_process(Checks& c, const std::string& what, const Trained& got, const Trained& want) {
  c.expect(got.losses.size() == want.losses.size(), what + ": as many losses");
  for (size_t i = 0; i < want.losses.size() && i < got.losses.size(); ++i) {
    c.expect(std::abs(got.losses[i] - want.losses[i]) <= 1e-5 * std::max(1.0, std::abs(want.losses[i])),
             what + " loss " + std::to_string(i) + ": " + std::to_string(got.losses[i]) + " vs " +
                 std::to_string(want.losses[i]));
  }
  c.expect(got.state.size() == want.state.size(), what + ": the same parameters and buffers");
  for (const auto& [name, value] : want.state) {
    auto it = got.state.find(name);
    const bool close = it != got.state.end() && it->second.sizes() == value.sizes() &&
                       at::allclose(it->second.to(value.scalar_type()), value, 1e-4, 1e-5);
    c.expect(close, what + ": " + name + " differs from one process");
  }
}

// Picks the strategy of `kind` (ddp, fsdp or fsdp-checkpoint) with `units`
// as FSDP's units (and checkpointed modules).
std::shared_ptr<strata::strategies::Strategy> strategy_of(const std::string& kind,
                                                          const strata::strategies::ModuleTypes& units) {
  std::shared_ptr<strata::strategies::Strategy> strategy;
  if (kind == "ddp") {
    strategy = std::make_shared<strata::strategies::DDPStrategy>(
        strata::strategies::cpu_accelerator(), std::nullopt,
        strata::strategies::DDPOptions().with_sync_batchnorm(true));
  } else {
    auto options = strata::strategies::FSDPOptions().with_auto_wrap_policy(units).with_sync_batchnorm(true);
    if (kind == "fsdp-checkpoint") options.with_activation_checkpointing_policy(units);
    strategy = std::make_shared<strata::strategies::FSDPStrategy>(strata::strategies::cpu_accelerator(),
                                                                  std::nullopt, options);
  }
  strategy->set_collective_timeout(std::chrono::seconds(60));
  return strategy;
}

STRATA_WORKER(zoo_strategy) {
  const std::string kind = args.at(0);  // ddp, fsdp or fsdp-checkpoint
  Fabric fabric(FabricOptions().with_strategy(strategy_of(kind, kBlocks)));
  Checks c;
  const std::vector<ZooCase> cases = zoo_cases();
  std::vector<Trained> reference;
  for (const ZooCase& zc : cases) reference.push_back(train(zc, nullptr, nullptr));
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    for (size_t m = 0; m < cases.size(); ++m) {
      const ZooCase& zc = cases[m];
      const Trained got = train(zc, &f, &c);
      const Trained& want = reference[m];
      expect_as_one_process(c, kind + " " + zc.name, got, want);
    }
  });
  return c.result();
}

// pytorch/examples' DCGAN: a generator (a holder) and a discriminator (a
// Sequential), two optimizers, three backward passes a step (the
// discriminator on real, then on fake images, then the generator through
// it), in the example's own loop with fabric.backward for loss.backward().
// Under fsdp each convolution is a unit.
Trained train_dcgan(Fabric* fabric, Checks* c) {
  at::manual_seed(11);
  const int64_t noise = 8;
  zoo::dcgan::DCGANGenerator generator(noise);
  torch::nn::Sequential discriminator = zoo::dcgan::create_discriminator();
  const std::vector<torch::nn::Module*> both{generator.ptr().get(), discriminator.ptr().get()};
  std::vector<int64_t> full_numel;
  for (torch::nn::Module* half : both)
    for (const at::Tensor& p : half->parameters()) full_numel.push_back(p.numel());
  if (fabric) {
    generator = fabric->setup_module(generator);
    discriminator = fabric->setup_module(discriminator);
  }
  // Plain SGD where the example has Adam(2e-4, betas 0.5, 0.5): with a
  // batch of 2 or 3 rows a rank the discriminator's sigmoid saturates
  // within a few steps at larger rates (a loss of 29 at 0.05), where
  // float32's sigmoid rounds to exactly 1 and binary cross-entropy's
  // clamps make the gradient jump between neighbouring inputs: rounding
  // then decides the result, one process against itself included. At 0.01
  // the losses stay between 1 and 5, where a change of 1e-7 in the
  // weights moves them by 1e-7.
  const auto options = torch::optim::SGDOptions(0.01);
  torch::optim::SGD g_opt(generator->parameters(), options), d_opt(discriminator->parameters(), options);
  if (fabric) fabric->setup_optimizers({&g_opt, &d_opt});
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  zoo::dcgan::Batch b = zoo::dcgan::batch(noise, kBatch);
  b.real_images = b.real_images.chunk(world)[rank];
  b.real_labels = b.real_labels.chunk(world)[rank];
  b.noise = b.noise.chunk(world)[rank];
  const auto backward = [fabric](const at::Tensor& loss) {
    if (fabric) {
      fabric->backward(loss);
    } else {
      loss.backward();
    }
  };
  const auto mean = [fabric](const at::Tensor& loss) {
    return (fabric ? fabric->all_reduce(loss.detach()) : loss.detach()).item<double>();
  };
  Trained out;
  for (int step = 0; step < kSteps; ++step) {
    zoo::dcgan::Losses losses = zoo::dcgan::train_step(generator, discriminator, g_opt, d_opt, b, backward);
    out.losses.push_back(mean(losses.d_loss));
    out.losses.push_back(mean(losses.g_loss));
  }
  auto* fsdp = fabric ? dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric->strategy()) : nullptr;
  if (fsdp) {
    // 1/N of every parameter on this rank.
    size_t k = 0;
    for (torch::nn::Module* half : both)
      for (const at::Tensor& p : half->parameters()) {
        const int64_t full = full_numel.at(k++);
        c->expect(p.numel() == (full + world - 1) / world,
                  "dcgan: a parameter holds " + std::to_string(p.numel()) + " of " + std::to_string(full));
      }
  }
  const std::pair<std::string, torch::nn::Module*> halves[] = {{"generator.", generator.ptr().get()},
                                                                {"discriminator.", discriminator.ptr().get()}};
  for (const auto& [prefix, module] : halves) {
    for (const auto& item : module->named_parameters()) {
      out.state[prefix + item.key()] =
          fsdp ? fsdp->full_parameter(*module, item.key()) : item.value().detach().clone();
    }
    for (const auto& item : module->named_buffers()) out.state[prefix + item.key()] = item.value().detach().clone();
  }
  if (fabric) fabric->barrier();
  return out;
}

STRATA_WORKER(zoo_dcgan_strategy) {
  const std::string kind = args.at(0);
  Fabric fabric(FabricOptions().with_strategy(strategy_of(kind, {"ConvTranspose2d", "Conv2d"})));
  Checks c;
  const Trained want = train_dcgan(nullptr, nullptr);
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    const Trained got = train_dcgan(&f, &c);
    expect_as_one_process(c, kind + " dcgan", got, want);
  });
  return c.result();
}

void expect_equal_to_one_process(int world, const std::string& kind) {
  for (const char* worker : {"zoo_strategy", "zoo_dcgan_strategy"}) {
    auto run = strata::testing::run_workers(world, worker, {kind});
    EXPECT_TRUE(run.ok()) << worker << " " << kind << " at " << world << ": " << run.launch.summary << "\n"
                          << run.output;
  }
}

TEST(ZooStrategiesTest, TheZooUnderDdpAtTwoAndThreeWorkersTrainsAsOneProcess) {
  expect_equal_to_one_process(2, "ddp");
  expect_equal_to_one_process(3, "ddp");
}

TEST(ZooStrategiesTest, TheZooUnderFsdpWithBlockUnitsAtTwoAndThreeWorkersTrainsAsOneProcess) {
  expect_equal_to_one_process(2, "fsdp");
  expect_equal_to_one_process(3, "fsdp");
}

TEST(ZooStrategiesTest, TheZooUnderFsdpWithCheckpointedBlocksTrainsAsOneProcess) {
  expect_equal_to_one_process(2, "fsdp-checkpoint");
  expect_equal_to_one_process(3, "fsdp-checkpoint");
}

}  // namespace
