// Every method and option of the strategy contract, on one process and on
// 2 and 3 worker processes (Gloo over loopback): collectives, module set-up
// and synchronisation, gradient clipping, no-sync, debug checks, unused
// parameters, data wrapping, teardown, and the error messages.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <sstream>

#include "strata/core/error.h"
#include "strata/data/dataset.h"
#include "strata/data/loader.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/single_device.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::DDPOptions;
using strata::strategies::DDPStrategy;

using strata::testing::Checks;
using strata::testing::contains;

struct TwoLinearImpl : torch::nn::Module {
  TwoLinearImpl() {
    a = register_module("a", torch::nn::Linear(4, 3));
    b = register_module("b", torch::nn::Linear(3, 2));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLinear);

std::shared_ptr<DDPStrategy> ddp(DDPOptions options = {}) {
  auto s = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt, options);
  s->set_collective_timeout(std::chrono::seconds(60));
  return s;
}

STRATA_WORKER(strategy_collectives) {
  Fabric fabric(FabricOptions().with_strategy(ddp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    const int world = f.world_size();
    const double r = f.global_rank();

    // all_gather: (world, *shape), rows in rank order; 0-d gathers to (world,).
    at::Tensor g = f.all_gather(at::full({2, 3}, r));
    c.expect(g.sizes() == at::IntArrayRef({world, 2, 3}), "all_gather shape");
    for (int k = 0; k < world; ++k) c.expect(g[k].eq(k).all().item<bool>(), "all_gather row " + std::to_string(k));
    c.expect(f.all_gather(at::scalar_tensor(r)).sizes() == at::IntArrayRef({world}), "0-d all_gather shape");

    // sync_grads: d(sum over ranks of sum_k w_k x_k)/dx_r = world * w_r.
    at::Tensor x = at::full({3}, r).set_requires_grad(true);
    at::Tensor w = (at::arange(world, at::kFloat) + 1).unsqueeze(1);
    (f.all_gather(x, /*sync_grads=*/true) * w).sum().backward();
    c.expect(x.grad().defined() && x.grad().eq(world * (r + 1)).all().item<bool>(), "all_gather sync_grads gradient");

    // all_reduce: default mean; sum/max/min by enum and by name; dtype kept.
    at::Tensor v = at::full({4}, r + 1);
    double sum = world * (world + 1) / 2.0;
    c.expect(f.all_reduce(v).eq(sum / world).all().item<bool>(), "all_reduce default is mean");
    c.expect(f.all_reduce(v, "sum").eq(sum).all().item<bool>(), "all_reduce sum");
    c.expect(f.all_reduce(v, "AVG").eq(sum / world).all().item<bool>(), "all_reduce avg (any case)");
    c.expect(f.all_reduce(v, strata::comm::ReduceOp::kMax).eq(world).all().item<bool>(), "all_reduce max");
    c.expect(f.all_reduce(v, "min").eq(1).all().item<bool>(), "all_reduce min");
    at::Tensor iv = at::full({2}, static_cast<int64_t>(r + 1), at::kLong);
    at::Tensor im = f.strategy().all_reduce(iv, "sum");
    c.expect(im.scalar_type() == at::kLong && im.eq(static_cast<int64_t>(sum)).all().item<bool>(), "all_reduce keeps int64");
    c.expect(v.eq(r + 1).all().item<bool>(), "all_reduce leaves its input unchanged");
    c.expect(contains(strata::testing::error_message([&] { f.all_reduce(v, "median"); }), "median"), "unknown op names itself");

    // broadcast: tensors of another shape on other ranks; any JSON value.
    at::Tensor mine = f.global_rank() == 1 ? at::arange(6, at::kFloat).reshape({2, 3}) : at::zeros({5});
    at::Tensor got = f.broadcast(mine, 1);
    c.expect(got.sizes() == at::IntArrayRef({2, 3}) && got.equal(at::arange(6, at::kFloat).reshape({2, 3})),
             "broadcast tensor from rank 1");
    std::map<std::string, std::vector<int>> value;
    if (f.global_rank() == 0) value = {{"a", {1, 2, 3}}, {"bb", {}}};
    auto received = f.broadcast(value, 0);
    c.expect(received == std::map<std::string, std::vector<int>>{{"a", {1, 2, 3}}, {"bb", {}}}, "broadcast map");
    c.expect(f.broadcast(std::string(f.global_rank() == 0 ? "hello" : "x"), 0) == "hello", "broadcast string");
    f.barrier("after-broadcast");
    c.expect(contains(strata::testing::error_message([&] { f.broadcast(mine, world); }), "src"), "broadcast src out of range");

    // Collections: element by element, vectors in order, maps by key.
    std::vector<at::Tensor> pair{at::full({2}, r), at::full({1, 3}, 10 * r)};
    std::vector<at::Tensor> gathered = f.all_gather(pair);
    c.expect(gathered.size() == 2 && gathered[0].sizes() == at::IntArrayRef({world, 2}) &&
                 gathered[1].sizes() == at::IntArrayRef({world, 1, 3}) && gathered[1][world - 1].eq(10 * (world - 1)).all().item<bool>(),
             "all_gather of a vector");
    std::map<std::string, at::Tensor> named{{"loss", at::full({}, r + 1)}, {"acc", at::full({2}, 2 * r)}};
    std::map<std::string, at::Tensor> summed = f.all_reduce(named, strata::comm::ReduceOp::kSum);
    c.expect(summed.size() == 2 && summed["loss"].item<double>() == sum && summed["acc"].eq(world * (world - 1)).all().item<bool>(),
             "all_reduce of a map (sum)");
    c.expect(f.all_gather(named)["acc"].sizes() == at::IntArrayRef({world, 2}), "all_gather of a map");
    std::vector<at::Tensor> sent;
    if (f.global_rank() == 1) sent = {at::arange(3, at::kLong), at::ones({2, 2})};
    std::vector<at::Tensor> vec = f.broadcast(sent, 1);
    c.expect(vec.size() == 2 && vec[0].equal(at::arange(3, at::kLong)) && vec[1].equal(at::ones({2, 2})),
             "broadcast of a vector: other ranks passed none");
    std::map<std::string, at::Tensor> state;
    if (f.global_rank() == 0) state = {{"w", at::full({2}, 7.0)}, {"step", at::full({}, 3, at::kLong)}};
    std::map<std::string, at::Tensor> got_state = f.broadcast(state, 0);
    c.expect(got_state.size() == 2 && got_state["w"].equal(at::full({2}, 7.0)) &&
                 got_state["step"].scalar_type() == at::kLong && got_state["step"].item<int64_t>() == 3,
             "broadcast of a map with its dtypes");
  });
  return c.failures == 0 ? 0 : 1;
}

STRATA_WORKER(strategy_ddp_module) {
  const bool sync_states = args.at(0) == "sync";
  Fabric fabric(FabricOptions().with_strategy(ddp(DDPOptions().with_sync_module_states(sync_states))));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    const int world = f.world_size();
    Fabric::seed_everything(100 + f.global_rank());  // different init on every rank
    TwoLinear model;
    TwoLinear stranger;
    std::string refused = strata::testing::error_message([&] { f.no_backward_sync(*model); });
    c.expect(contains(refused, "[ddp] no_backward_sync got a module that was not set up (") &&
                 contains(refused, "and no module has been set up yet"),
             "no_backward_sync before setup_module is refused: " + refused);
    f.setup_module(model);
    refused = strata::testing::error_message([&] { f.no_backward_sync(*stranger); });
    c.expect(contains(refused, "not the one setup_module returned"), "no_backward_sync of another module: " + refused);
    torch::optim::SGD stranger_opt(stranger->parameters(), torch::optim::SGDOptions(0.1));
    refused = strata::testing::error_message([&] { f.clip_gradients(*stranger, stranger_opt, 1.0); });
    c.expect(contains(refused, "[ddp] clip_gradients got a module that was not set up"),
             "clip_gradients of another module: " + refused);
    at::Tensor rows = f.all_gather(model->a->weight.detach());
    bool all_equal = true;
    for (int k = 1; k < world; ++k) all_equal = all_equal && rows[k].equal(rows[0]);
    c.expect(all_equal == sync_states, sync_states ? "sync_module_states makes every rank equal rank 0"
                                                   : "without sync_module_states ranks keep their own init");
    if (!sync_states) return;

    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    f.setup_optimizer(optimizer);
    const double r = f.global_rank();

    // Gradients are averaged: loss_r = (r + 1) * sum(a(x)) with the same x.
    at::Tensor x = at::ones({1, 4});
    f.backward(model->a(x).sum() * (r + 1));
    double mean_scale = (world + 1) / 2.0;
    at::Tensor expected = at::ones({3, 4}) * mean_scale;
    c.expect(at::allclose(model->a->weight.grad(), expected), "DDP averages gradients across ranks");

    // no_backward_sync: local accumulation, then the next synced backward
    // reduces the sum.
    optimizer.zero_grad();
    {
      auto no_sync = f.no_backward_sync(*model);
      f.backward(model->a(x).sum() * (r + 1));
    }
    c.expect(at::allclose(model->a->weight.grad(), at::ones({3, 4}) * (r + 1)), "no_backward_sync keeps local grads");
    f.backward(model->a(x).sum() * (r + 1));
    c.expect(at::allclose(model->a->weight.grad(), at::ones({3, 4}) * 2 * mean_scale),
             "the synced backward reduces the accumulated sum");

    // A parameter only rank 0 uses: no hang, and the others get its average.
    optimizer.zero_grad();
    at::Tensor h = model->a(x);
    at::Tensor loss = f.global_rank() == 0 ? model->b(h).sum() : h.sum();
    f.backward(loss);
    at::Tensor bgrad = model->b->weight.grad();
    at::Tensor rank0 = f.broadcast(bgrad.defined() ? bgrad : at::zeros({2, 3}), 0);
    c.expect(bgrad.defined() && at::allclose(bgrad, rank0), "unused parameter: every rank gets the same gradient");

    // Clipping sees averaged gradients: every rank returns the same norm.
    at::Tensor norm = f.clip_gradients(*model, optimizer, 0.5);
    at::Tensor norms = f.all_gather(norm);
    c.expect(at::allclose(norms, norms[0].expand_as(norms)), "clip norm equal on every rank");
  });
  return c.failures == 0 ? 0 : 1;
}

STRATA_WORKER(strategy_debug) {
  Fabric fabric(FabricOptions().with_strategy(ddp(DDPOptions().with_debug(true))));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    TwoLinear model;
    f.setup_module(model);
    f.backward(model->b(model->a(at::ones({1, 4}))).sum());  // prints the per-step report on rank 0
    at::Tensor t = at::ones({2, f.global_rank() + 1});
    std::string what = strata::testing::error_message([&] { f.all_reduce(t); });
    c.expect(contains(what, "rank 0") && contains(what, "rank 1"), "debug mismatch names the ranks: " + what);
  });
  return c.failures == 0 ? 0 : 1;
}

STRATA_WORKER(strategy_checkpoint) {
  std::string path = args.at(0);
  Fabric fabric(FabricOptions().with_strategy(ddp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Fabric::seed_everything(5);
    TwoLinear model;
    f.setup_module(model);
    strata::strategies::State state{{"model", model}, {"epoch", 3}};
    f.save(path, state);
    c.expect(std::filesystem::exists(std::filesystem::path(path) / "state.safetensors"), "rank 0 wrote the checkpoint");
    Fabric::seed_everything(77);
    TwoLinear fresh;
    strata::strategies::State into{{"model", fresh}, {"epoch", 0}};
    f.load(path, into);
    c.expect(fresh->a->weight.equal(model->a->weight), "every rank loads the saved weights");
    c.expect(into.at("epoch").get<int>() == 3, "values are restored");
    f.strategy().remove_checkpoint(path);
    c.expect(!std::filesystem::exists(path), "remove_checkpoint removed it");
  });
  return c.failures == 0 ? 0 : 1;
}

TEST(StrategyTest, CollectivesFollowTheSeedSemanticsOnTwoAndThreeRanks) {
  for (int world : {2, 3}) {
    auto run = strata::testing::run_workers(world, "strategy_collectives");
    EXPECT_TRUE(run.ok()) << "world " << world << ": " << run.launch.summary << "\n" << run.output;
  }
}

TEST(StrategyTest, DdpSynchronisesModulesAndAveragesGradients) {
  auto run = strata::testing::run_workers(3, "strategy_ddp_module", {"sync"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(StrategyTest, WithoutSyncModuleStatesRanksKeepTheirOwnInit) {
  auto run = strata::testing::run_workers(2, "strategy_ddp_module", {"nosync"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(StrategyTest, DebugModeReportsCommunicationAndNamesMismatchedRanks) {
  auto run = strata::testing::run_workers(2, "strategy_debug");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  EXPECT_NE(run.output.find("[ddp] step 1 communication:"), std::string::npos) << run.output;
}

TEST(StrategyTest, RankZeroSavesEveryRankLoadsAndRemoveCheckpointDeletes) {
  std::string path = (std::filesystem::temp_directory_path() / ("strata-ddp-ckpt-" + std::to_string(::getpid()))).string();
  auto run = strata::testing::run_workers(2, "strategy_checkpoint", {path});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

// ---- one process --------------------------------------------------------------------

TEST(StrategyTest, BeforeLaunchRanksAreZeroAndRootDeviceIsAnError) {
  DDPStrategy strategy;
  EXPECT_EQ(strategy.global_rank(), 0);
  EXPECT_EQ(strategy.world_size(), 1);
  EXPECT_FALSE(strategy.launched());
  std::string what = strata::testing::error_message([&] { strategy.root_device(); });
  EXPECT_TRUE(contains(what, "[ddp] root_device is only known after launch")) << what;
}

TEST(StrategyTest, NamesAreResolvedAndXlaOffXlaDevicesIsRefusedWithAHint) {
  auto cpu = strata::strategies::cpu_accelerator();
  auto fp32 = strata::strategies::Precision::parse("32-true");
  EXPECT_EQ(strata::strategies::make_strategy("ddp", cpu, fp32, 2)->name(), "ddp");
  EXPECT_EQ(strata::strategies::make_strategy("auto", cpu, fp32, 1)->name(), "single_device");
  EXPECT_EQ(strata::strategies::make_strategy("auto", cpu, fp32, 4)->name(), "ddp");
  std::string xla = strata::testing::error_message([&] { strata::strategies::make_strategy("xla", cpu, fp32, 2); });
  EXPECT_TRUE(contains(xla, "'xla' trains on xla devices") && contains(xla, "use 'ddp'")) << xla;
  std::string xla_fsdp = strata::testing::error_message([&] { strata::strategies::make_strategy("xla_fsdp", cpu, fp32, 2); });
  EXPECT_TRUE(contains(xla_fsdp, "'xla_fsdp' trains on xla devices") && contains(xla_fsdp, "use 'fsdp'")) << xla_fsdp;
  std::string bad = strata::testing::error_message([&] { strata::strategies::make_strategy("dpp", cpu, fp32, 2); });
  EXPECT_TRUE(contains(bad, "unknown strategy 'dpp'") && contains(bad, "ddp")) << bad;
  // "tpu" needs a TPU plugin; the test environment's is the CPU's (or none).
  std::string tpu = strata::testing::error_message([] { strata::strategies::make_accelerator("tpu"); });
  EXPECT_TRUE(contains(tpu, "'tpu' asks for a TPU") || contains(tpu, "no PJRT plugin found")) << tpu;
}

TEST(StrategyTest, PrecisionBf16MixedAutocastsForwardOnly) {
  EXPECT_TRUE(contains(strata::testing::error_message([] { strata::strategies::Precision::parse("8-true"); }), "unknown precision"));
  EXPECT_TRUE(contains(strata::testing::error_message([] { strata::strategies::Precision::parse("bf16-true"); }), "not supported"));
  Fabric fabric(FabricOptions().with_precision("bf16-mixed"));
  at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    auto scope = fabric.autocast();
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  Fabric fp32(FabricOptions().with_precision("32-true"));
  auto scope = fp32.autocast();
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
}

TEST(StrategyTest, ClipByNormReturnsTheNormAndScalesAndHonoursNonFinite) {
  Fabric fabric;
  fabric.launch([&](Fabric& f) {
    TwoLinear model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    TwoLinear stranger;
    std::string refused = strata::testing::error_message([&] { f.clip_gradients(*model, optimizer, 1.0); });
    EXPECT_EQ(refused, "[single_device] clip_gradients got a module that was not set up ((anonymous namespace)::TwoLinearImpl, and no module "
                       "has been set up yet); pass the module returned by setup_module (fabric.setup_module(model)), "
                       "as Lightning requires");
    model = f.setup_module(model);
    refused = strata::testing::error_message([&] { f.clip_gradients(*stranger, optimizer, std::nullopt, 0.5); });
    EXPECT_TRUE(contains(refused, "TwoLinearImpl, not the one setup_module returned)")) << refused;
    refused = strata::testing::error_message([&] { f.no_backward_sync(*stranger); });
    EXPECT_TRUE(contains(refused, "[single_device] no_backward_sync got a module that was not set up")) << refused;
    for (auto& p : model->parameters()) p.mutable_grad() = at::full_like(p, 2.0);
    int64_t n = 0;
    for (auto& p : model->parameters()) n += p.numel();
    double expected = 2.0 * std::sqrt(static_cast<double>(n));
    at::Tensor norm = f.clip_gradients(*model, optimizer, 1.0);
    EXPECT_NEAR(norm.item<double>(), expected, 1e-4);
    double after = 0;
    for (auto& p : model->parameters()) after += p.grad().pow(2).sum().item<double>();
    EXPECT_NEAR(std::sqrt(after), 1.0, 1e-4);
    at::Tensor inf_norm = f.clip_gradients(*model, optimizer, 10.0, std::nullopt, INFINITY);
    EXPECT_NEAR(inf_norm.item<double>(), 1.0 / std::sqrt(static_cast<double>(n)), 1e-5);

    model->a->weight.mutable_grad()[0][0] = NAN;
    std::string what = strata::testing::error_message([&] { f.clip_gradients(*model, optimizer, 1.0); });
    EXPECT_TRUE(contains(what, "non-finite")) << what;
    EXPECT_NO_THROW(f.strategy().clip_gradients_norm(*model, optimizer, 1.0, 2.0, /*error_if_nonfinite=*/false));

    for (auto& p : model->parameters()) p.mutable_grad() = at::linspace(-3, 3, p.numel()).view(p.sizes());
    f.clip_gradients(*model, optimizer, std::nullopt, 0.5);
    for (auto& p : model->parameters()) EXPECT_LE(p.grad().abs().max().item<double>(), 0.5 + 1e-7);
    EXPECT_TRUE(contains(strata::testing::error_message([&] { f.clip_gradients(*model, optimizer, 1.0, 0.5); }), "exactly one"));
  });
}

TEST(StrategyTest, ProcessDataloaderWrapsOnceAndTeardownClosesIt) {
  Fabric fabric;
  fabric.launch([&](Fabric& f) {
    auto dataset = std::make_shared<strata::data::TensorDataset>(at::arange(10).view({10, 1}),
                                                                 at::arange(10).view({10, 1}));
    auto loader = std::make_shared<strata::data::DataLoader>(dataset, 2);
    auto wrapped = f.setup_dataloader(loader);
    EXPECT_TRUE(wrapped->is_device_loader());
    EXPECT_EQ(wrapped->size(), 5u);
    EXPECT_EQ(f.setup_dataloader(wrapped), wrapped) << "a device loader is not wrapped twice";
    wrapped->reset();
    auto first = wrapped->next();
    ASSERT_TRUE(first.has_value());
    EXPECT_TRUE(first->input.equal(at::arange(2).view({2, 1})));
    f.strategy().teardown();
    EXPECT_FALSE(wrapped->next().has_value()) << "teardown stops the device loader";
    EXPECT_FALSE(f.strategy().launched());
  });
}

TEST(StrategyTest, SaveAndLoadRoundTripStateInPlace) {
  std::string path = (std::filesystem::temp_directory_path() / ("strata-state-" + std::to_string(::getpid()))).string();
  Fabric fabric;
  fabric.launch([&](Fabric& f) {
    Fabric::seed_everything(1);
    TwoLinear model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    f.backward(model->b(model->a(at::ones({2, 4}))).sum());
    optimizer.step();
    at::Tensor counter = at::arange(3, at::kFloat);
    f.save(path, {{"model", model}, {"opt", optimizer}, {"counter", counter}, {"name", "run-1"}, {"extra", 42}});

    Fabric::seed_everything(2);
    TwoLinear fresh;
    torch::optim::SGD fresh_opt(fresh->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    at::Tensor counter_in = at::zeros({3});
    strata::strategies::State state{{"model", fresh}, {"opt", fresh_opt}, {"counter", counter_in}, {"name", ""}};
    nlohmann::json rest = f.load(path, state);
    EXPECT_TRUE(fresh->a->weight.equal(model->a->weight));
    EXPECT_TRUE(counter_in.equal(counter)) << "tensors are filled in place";
    EXPECT_EQ(state.at("name").get<std::string>(), "run-1");
    EXPECT_EQ(rest.value("extra", 0), 42) << rest.dump();
    EXPECT_DOUBLE_EQ(static_cast<torch::optim::SGDOptions&>(fresh_opt.param_groups()[0].options()).lr(), 0.1);

    strata::strategies::State missing{{"model", fresh}, {"nope", 1}};
    std::string what = strata::testing::error_message([&] { f.load(path, missing); });
    EXPECT_TRUE(contains(what, "nope") && contains(what, "strict=false")) << what;
    EXPECT_NO_THROW(f.load(path, missing, /*strict=*/false));
    strata::strategies::State empty;
    EXPECT_TRUE(contains(strata::testing::error_message([&] { f.load(path, empty); }), "empty state"));
    EXPECT_TRUE(contains(strata::testing::error_message([&] { f.strategy().save_checkpoint(path + "-x", {{"m", model}}, {{"k", 1}}); }),
                         "storage_options"));
  });
  std::filesystem::remove_all(path);
}

TEST(StrategyTest, FabricRejectsBadOptionsAndASecondLaunch) {
  EXPECT_TRUE(contains(strata::testing::error_message([] { Fabric f(FabricOptions().with_devices(0)); }), "devices must be >= 1"));
  EXPECT_TRUE(contains(strata::testing::error_message([] { Fabric f(FabricOptions().with_precision("fp8")); }), "unknown precision"));
  Fabric fabric;
  fabric.launch([](Fabric&) {});
  EXPECT_TRUE(contains(strata::testing::error_message([&] { fabric.launch([](Fabric&) {}); }), "already called"));
  auto bad = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                           DDPOptions().with_parallel_devices({c10::Device("cpu"), c10::Device("cpu")}));
  Fabric two(FabricOptions().with_strategy(bad));
  EXPECT_TRUE(contains(strata::testing::error_message([&] { two.launch([](Fabric&) {}); }), "parallel_devices lists 2"));
}

TEST(StrategyTest, SetupModuleAndOptimizersSetsUpBoth) {
  Fabric fabric(FabricOptions().with_strategy(ddp()));
  fabric.launch([&](Fabric& f) {
    TwoLinear model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    f.strategy().setup_module_and_optimizers(model.ptr(), {&optimizer});
    EXPECT_GT(static_cast<DDPStrategy&>(f.strategy()).num_buckets(), 0u);
    auto scope = f.strategy().module_init_context(true);
  });
}

}  // namespace

namespace {

TEST(StrategyTest, FabricConveniencesSetupInitModuleAndNamedClipping) {
  Fabric fabric(FabricOptions().with_strategy(ddp()));
  fabric.launch([&](Fabric& f) {
    TwoLinear model;
    {
      auto scope = f.init_module(/*empty_init=*/true);  // DDP builds plainly, as Lightning's DDP does
      TwoLinear inside;
      EXPECT_TRUE(inside->a->weight.device().is_cpu());
    }
    torch::optim::SGD first(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD second(model->parameters(), torch::optim::SGDOptions(0.2));
    TwoLinear same = f.setup(model, first, second);
    EXPECT_EQ(same.ptr().get(), model.ptr().get());
    EXPECT_GT(static_cast<DDPStrategy&>(f.strategy()).num_buckets(), 0u) << "setup registered the gradient hooks";

    for (auto& p : model->parameters()) p.mutable_grad() = at::full_like(p, 2.0);
    int64_t n = 0;
    for (auto& p : model->parameters()) n += p.numel();
    at::Tensor norm = f.clip_gradients(*model, first, strata::ClipByNorm{1.0});
    EXPECT_NEAR(norm.item<double>(), 2.0 * std::sqrt(static_cast<double>(n)), 1e-4);
    for (auto& p : model->parameters()) p.mutable_grad() = at::linspace(-3, 3, p.numel()).view(p.sizes());
    f.clip_gradients(*model, first, strata::ClipByValue{0.25});
    for (auto& p : model->parameters()) EXPECT_LE(p.grad().abs().max().item<double>(), 0.25 + 1e-7);
  });
}

}  // namespace
