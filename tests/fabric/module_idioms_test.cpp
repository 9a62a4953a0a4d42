// What LibTorch's examples hold their model in reaches setup_module as it
// is: a ModuleHolder (TORCH_MODULE), a std::shared_ptr to the module class,
// or the module by value (`Net model; fabric.setup_module(model);`, Note
// [Modules held by value] in strategies/strategy.h), declared inside the
// launched function, so it is gone before the strategy's teardown. Under
// ddp and fsdp at 2 workers each trains as one process does on the whole
// batch; under fsdp two modules held by value, one after the other (at the
// same address, as a loop's local), are two modules.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::testing::Checks;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(at::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;  // global

at::Tensor inputs(int step) { return at::randn({kBatch, 3}, at::detail::createCPUGenerator(20 + step)); }
at::Tensor targets(int step) { return at::randn({kBatch, 1}, at::detail::createCPUGenerator(40 + step)); }

// Trains `model` for kSteps on this rank's share of each global batch;
// returns its parameters, flattened.
at::Tensor train(NetImpl& model, Fabric* fabric) {
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1));
  if (fabric) fabric->setup_optimizer(opt);
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    at::Tensor loss = (model.forward(inputs(step).chunk(world)[rank]) - targets(step).chunk(world)[rank]).pow(2).mean();
    if (fabric) {
      fabric->backward(loss);
    } else {
      loss.backward();
    }
    opt.step();
  }
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : model.parameters()) flat.push_back(p.detach().reshape({-1}));
  return at::cat(flat);
}

// The full values of `model`'s parameters under fsdp, flattened as train's.
at::Tensor full_values(Fabric& fabric, NetImpl& model) {
  auto& fsdp = dynamic_cast<strata::strategies::FSDPStrategy&>(fabric.strategy());
  std::vector<at::Tensor> flat;
  for (const auto& item : model.named_parameters()) flat.push_back(fsdp.full_parameter(model, item.key()).reshape({-1}));
  return at::cat(flat);
}

at::Tensor one_process() {
  at::manual_seed(3);
  NetImpl model;
  return train(model, nullptr);
}

STRATA_WORKER(module_idioms) {
  const std::string kind = args.at(0), form = args.at(1);
  const at::Tensor expected = one_process();
  std::shared_ptr<strata::strategies::Strategy> strategy;
  if (kind == "fsdp") {
    strategy = std::make_shared<strata::strategies::FSDPStrategy>();
  } else {
    strategy = std::make_shared<strata::strategies::DDPStrategy>();
  }
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    // Trains `model` (set up already) and compares its full parameters.
    const auto check = [&](NetImpl& model, const std::string& what) {
      at::Tensor got = train(model, &f);
      if (kind == "fsdp") got = full_values(f, model);
      c.expect(at::allclose(got, expected, 1e-5, 1e-6),
               kind + " " + what + ": the parameters differ from one process's by " +
                   std::to_string((got - expected).abs().max().item<double>()));
    };
    at::manual_seed(3);
    if (form == "holder") {
      Net model;
      model = f.setup_module(model);
      check(*model, form);
    } else if (form == "shared_ptr") {
      std::shared_ptr<NetImpl> model = f.setup_module(std::make_shared<NetImpl>());
      check(*model, form);
    } else {
      // By value, gone before the strategy's teardown; twice in a row, so
      // the second is likely built where the first was.
      for (int run = 0; run < (form == "values" ? 2 : 1); ++run) {
        at::manual_seed(3);
        NetImpl model;
        NetImpl& same = f.setup_module(model);
        c.expect(&same == &model, "setup_module returns the module held by value");
        check(model, form + " run " + std::to_string(run));
      }
    }
  });
  return c.result();
}

TEST(ModuleIdiomsTest, AModuleHolderTrainsUnderDdpAsOneProcess) {
  auto run = strata::testing::run_workers(2, "module_idioms", {"ddp", "holder"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(ModuleIdiomsTest, ASharedPtrToTheModuleClassTrainsUnderDdpAsOneProcess) {
  auto run = strata::testing::run_workers(2, "module_idioms", {"ddp", "shared_ptr"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(ModuleIdiomsTest, AModuleHeldByValueTrainsUnderDdpAsOneProcess) {
  auto run = strata::testing::run_workers(2, "module_idioms", {"ddp", "value"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(ModuleIdiomsTest, AModuleHeldByValueOnOneDeviceIsSetUpInPlace) {
  Fabric fabric(FabricOptions().with_strategy("single_device"));
  fabric.launch([](Fabric& f) {
    at::manual_seed(3);
    NetImpl model;
    NetImpl& same = f.setup_module(model);
    EXPECT_EQ(&same, &model);
    const at::Tensor trained = train(model, &f);
    EXPECT_TRUE(at::allclose(trained, one_process(), 1e-6, 1e-7));
  });
}

TEST(ModuleIdiomsTest, AnOwnedModulePassedByReferenceIsSetUpThroughItsOwner) {
  Fabric fabric(FabricOptions().with_strategy("single_device"));
  fabric.launch([](Fabric& f) {
    auto owner = std::make_shared<NetImpl>();
    f.setup_module(*owner);
    // Not borrowed: the strategy holds the owner.
    EXPECT_FALSE(strata::strategies::borrowed(strata::strategies::module_pointer(*owner)));
    EXPECT_GE(owner.use_count(), 2);
  });
}

TEST(ModuleIdiomsTest, ModulesHeldByValueOneAfterTheOtherTrainUnderFsdpAsOneProcess) {
  auto run = strata::testing::run_workers(2, "module_idioms", {"fsdp", "values"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
