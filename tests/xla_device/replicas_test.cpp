// Replicas of one step in one process (strata/xla_device/replicas.h): each of N
// threads records on its own CPU-plugin device, the collectives go into the
// step, and the N graphs run as one replicated program. Checked against
// values computed by hand and against one-process CPU training on the whole
// batch.
#include <c10/core/DeviceGuard.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <thread>

#include "strata/comm/group.h"
#include "strata/xla_device/replicas.h"
#include "xla_device_test.h"

namespace {

using strata::comm::Group;
using strata::comm::ReduceOp;
using strata::xla::ReplicaGroup;

class XlaReplicasTest : public strata::testing::XlaDeviceFixture {
 protected:
  void SetUp() override {
    XlaDeviceFixture::SetUp();
    if (IsSkipped()) return;
    if (strata::xla::device_count() < 4) GTEST_SKIP() << "the plugin addresses fewer than 4 devices";
  }

  // Runs fn(rank) on one thread per replica, each with xla:devices[rank]
  // as its current device; returns each rank's error message ("" if none).
  static std::vector<std::string> on_replicas(const ReplicaGroup& group, const std::function<void(int)>& fn) {
    const int n = group.size();
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        c10::DeviceGuard guard(strata::xla::device(group.devices()[r]));
        try {
          fn(r);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }

  static void expect_no_errors(const std::vector<std::string>& errors) {
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "replica " << r;
  }
};

TEST_F(XlaReplicasTest, CollectivesRecordIntoOneReplicatedStep) {
  for (int n : {2, 4}) {
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r) devices[r] = r;
    ReplicaGroup replicas(devices, std::chrono::seconds(60));
    strata::xla::reset_metrics();
    std::vector<std::map<std::string, at::Tensor>> got(n);
    expect_no_errors(on_replicas(replicas, [&](int r) {
      Group group(replicas.backend(r));
      const c10::Device device = strata::xla::device(r);
      // Replica r holds r+1, 2(r+1), ..., 6(r+1), made on the CPU: every
      // replica records the same ops.
      at::Tensor x = (torch::arange(1, 7, torch::kFloat).reshape({2, 3}) * (r + 1)).to(device);
      at::Tensor sum = x.clone(), mean = x.clone(), max = x.clone(), min = x.clone();
      group.all_reduce(sum, ReduceOp::kSum);
      group.all_reduce(mean, ReduceOp::kMean);
      group.all_reduce(max, ReduceOp::kMax);
      group.all_reduce(min, ReduceOp::kMin);
      at::Tensor gathered = group.all_gather(x);  // [n, 2, 3]
      at::Tensor scattered = group.reduce_scatter((torch::arange(0, 2 * n, torch::kFloat) * (r + 1)).to(device),
                                                  ReduceOp::kSum);  // [2]
      at::Tensor from_last = x.clone();
      group.broadcast(from_last, n - 1);
      EXPECT_TRUE(sum.device() == device && gathered.device() == device);
      strata::xla::mark_step();
      got[r] = {{"sum", sum.cpu()}, {"mean", mean.cpu()}, {"max", max.cpu()}, {"min", min.cpu()},
                {"gathered", gathered.cpu()}, {"scattered", scattered.cpu()}, {"from_last", from_last.cpu()}};
    }));
    const at::Tensor base = torch::arange(1, 7, torch::kFloat).reshape({2, 3});
    const double total = n * (n + 1) / 2.0;  // 1 + 2 + ... + n
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("replica " + std::to_string(r) + " of " + std::to_string(n));
      EXPECT_TRUE(torch::equal(got[r]["sum"], base * total));
      EXPECT_TRUE(torch::allclose(got[r]["mean"], base * total / n, 0, 1e-6));
      EXPECT_TRUE(torch::equal(got[r]["max"], base * n));
      EXPECT_TRUE(torch::equal(got[r]["min"], base));
      for (int k = 0; k < n; ++k) EXPECT_TRUE(torch::equal(got[r]["gathered"][k], base * (k + 1))) << "part " << k;
      // sum over k of arange(2n) * (k+1), replica r's part [2r, 2r+2)
      EXPECT_TRUE(torch::equal(got[r]["scattered"], torch::arange(2 * r, 2 * r + 2, torch::kFloat) * total));
      EXPECT_TRUE(torch::equal(got[r]["from_last"], base * n));
    }
    const strata::xla::Metrics m = strata::xla::metrics();
    // The broadcast runs what was recorded before it (Note [Collectives of
    // the replicas]); the rest runs at the mark: two replicated programs.
    EXPECT_EQ(m.executions, 2) << "every replica's step ran as replicated programs";
    EXPECT_EQ(m.steps, 1);
    EXPECT_EQ(m.fallback_calls(), 0);
    EXPECT_EQ(m.lowered.at("strata::all_reduce"), 4 * n);
  }
}

TEST_F(XlaReplicasTest, HostCollectivesMeetBetweenTheThreads) {
  ReplicaGroup replicas({0, 1, 2}, std::chrono::seconds(60));
  std::vector<std::vector<std::string>> gathered(3);
  std::vector<std::string> broadcast(3);
  std::vector<at::Tensor> sums(3);
  std::atomic<int> before{0};
  std::vector<int> seen_before(3);
  expect_no_errors(on_replicas(replicas, [&](int r) {
    Group group(replicas.backend(r));
    EXPECT_EQ(group.rank(), r);
    EXPECT_EQ(group.size(), 3);
    EXPECT_EQ(group.backend_name(), "xla");
    broadcast[r] = group.broadcast_object(std::string(r == 2 ? "from two" : "not sent"), 2);
    gathered[r] = group.all_gather_object(std::string(r + 1, 'x'));
    at::Tensor t = torch::full({3}, static_cast<double>(r));
    group.all_reduce(t, ReduceOp::kSum);
    sums[r] = t;
    ++before;
    group.barrier("after");
    seen_before[r] = before.load();
  }));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(broadcast[r], "from two");
    EXPECT_EQ(gathered[r], (std::vector<std::string>{"x", "xx", "xxx"}));
    EXPECT_TRUE(torch::equal(sums[r], torch::full({3}, 3.0)));
    EXPECT_EQ(seen_before[r], 3) << "the barrier let replica " << r << " go before every replica reached it";
  }
}

// Data parallel by hand: each replica trains on its slice of the batch and
// averages its gradients in the step; every replica ends with the weights
// one CPU process gets from the whole batch.
TEST_F(XlaReplicasTest, DataParallelMlpMatchesTheWholeBatchOnTheCpu) {
  constexpr int kSteps = 20;
  for (int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " replicas");
    torch::manual_seed(5);
    strata::testing::Mlp reference;
    std::vector<at::Tensor> xs, ys;
    for (int step = 0; step <= kSteps; ++step) {
      xs.push_back(torch::randn({8, 6}));
      ys.push_back(torch::randn({8, 3}));
    }
    std::vector<float> cpu_losses;
    std::vector<at::Tensor> initial;
    for (const at::Tensor& p : reference.parameters()) initial.push_back(p.detach().clone());
    {
      torch::optim::AdamW opt(reference.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      for (int step = 0; step <= kSteps; ++step) {
        opt.zero_grad();
        at::Tensor loss = torch::mse_loss(reference.forward(xs[step]), ys[step]);
        loss.backward();
        opt.step();
        cpu_losses.push_back(loss.item<float>());
      }
    }
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r) devices[r] = r;
    strata::xla::mark_step();  // before the replication: this thread's device is xla:0, replica 0's
    strata::xla::reset_metrics();
    ReplicaGroup replicas(devices, std::chrono::seconds(120));
    std::vector<std::vector<at::Tensor>> final_params(n);
    std::vector<std::vector<float>> losses(n);
    int64_t compiles_after_step_2 = -1;
    expect_no_errors(on_replicas(replicas, [&](int r) {
      const c10::Device device = strata::xla::device(r);
      Group group(replicas.backend(r));
      strata::testing::Mlp model;
      {
        torch::NoGradGuard no_grad;
        auto params = model.parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
      }
      model.to(device);
      torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      const int64_t rows = 8 / n;
      for (int step = 0; step <= kSteps; ++step) {
        opt.zero_grad();
        at::Tensor x = xs[step].narrow(0, r * rows, rows).to(device);
        at::Tensor y = ys[step].narrow(0, r * rows, rows).to(device);
        at::Tensor loss = torch::mse_loss(model.forward(x), y);
        loss.backward();
        for (const at::Tensor& p : model.parameters()) {
          at::Tensor g = p.grad();
          group.all_reduce(g, ReduceOp::kMean);
        }
        opt.step();
        at::Tensor mean_loss = loss.detach().clone();
        group.all_reduce(mean_loss, ReduceOp::kMean);
        strata::xla::mark_step();
        losses[r].push_back(mean_loss.item<float>());
        if (step == 2 && r == 0) compiles_after_step_2 = strata::xla::metrics().compiles;
      }
      for (const at::Tensor& p : model.parameters()) final_params[r].push_back(p.detach().cpu());
    }));
    ASSERT_EQ(losses[0].size(), cpu_losses.size());
    for (int step = 0; step <= kSteps; ++step) {
      const double tol = step == 0 ? 1e-5 : 1e-3;
      EXPECT_NEAR(losses[0][step], cpu_losses[step], tol * std::abs(cpu_losses[step])) << "step " << step;
    }
    std::printf("%d replicas: step 0 loss %.9g (cpu %.9g), step %d %.9g (cpu %.9g)\n", n, losses[0][0],
                cpu_losses[0], kSteps, losses[0][kSteps], cpu_losses[kSteps]);
    auto want = reference.parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      const double scale = want[i].abs().max().item<double>();
      const double diff = (final_params[0][i] - want[i]).abs().max().item<double>();
      std::printf("parameter %zu: max difference %.3g relative %.3g\n", i, diff, diff / scale);
      EXPECT_LE(diff, 1e-3 * scale) << "parameter " << i;
      for (int r = 1; r < n; ++r)
        EXPECT_TRUE(torch::equal(final_params[r][i], final_params[0][i])) << "parameter " << i << " of replica " << r;
    }
    const strata::xla::Metrics m = strata::xla::metrics();
    EXPECT_EQ(m.fallback_calls(), 0);
    for (const auto& [op, calls] : m.fallbacks) ADD_FAILURE() << op << " fell back " << calls << " times";
    EXPECT_EQ(m.executions, kSteps + 1) << "one replicated program per step";
    EXPECT_EQ(m.compiles, compiles_after_step_2) << "no compile after step 2";
    EXPECT_LE(m.compiles, 3);
    EXPECT_GT(m.buffers_donated, 0) << "the replicas give up the buffers only the step holds";
  }
}

TEST_F(XlaReplicasTest, AReplicaThatDoesNotEndTheStepIsNamed) {
  ReplicaGroup replicas({0, 1}, std::chrono::milliseconds(300));
  const auto errors = on_replicas(replicas, [&](int r) {
    Group group(replicas.backend(r));
    at::Tensor x = torch::ones({4}).to(strata::xla::device(r));
    group.all_reduce(x, ReduceOp::kSum);
    if (r == 0) strata::xla::mark_step();  // replica 1 never ends its step
  });
  EXPECT_NE(errors[0].find("replica 0 (xla:0) waited 300 ms"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("at the end of a step for replica 1 (xla:1)"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
  // The pending collective went with the replicas' tensors; nothing is left.
}

TEST_F(XlaReplicasTest, ReplicasThatRecordDifferentStepsFailTogether) {
  ReplicaGroup replicas({0, 1}, std::chrono::seconds(60));
  const auto errors = on_replicas(replicas, [&](int r) {
    Group group(replicas.backend(r));
    at::Tensor x = torch::ones({4}).to(strata::xla::device(r));
    if (r == 1) x = x * 3;  // one op more on replica 1
    group.all_reduce(x, ReduceOp::kSum);
    strata::xla::mark_step();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("replica 1 recorded another step than replica 0"), std::string::npos) << errors[r];
}

TEST_F(XlaReplicasTest, RefusesWhatCannotBeReplicated) {
  try {
    ReplicaGroup twice({0, 0});
    ADD_FAILURE() << "a device given twice was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("xla:0 is given twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ReplicaGroup({0, 99}), strata::ConfigError);
  ReplicaGroup first({0, 1});
  try {
    ReplicaGroup second({2, 3});
    ADD_FAILURE() << "a second replication was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("one replicated step at a time"), std::string::npos) << e.what();
  }
  EXPECT_THROW(first.backend(2), strata::ConfigError);
  // A tensor of another device than the replica's.
  auto backend = first.backend(1);
  at::Tensor other = torch::ones({2}).to(strata::xla::device(0));
  try {
    backend->all_reduce(other, ReduceOp::kSum);
    ADD_FAILURE() << "replica 1 reduced a tensor of xla:0";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 reduces tensors of xla:1"), std::string::npos) << e.what();
  }
}

// Note [Replicas that wait apart]: a collective only some replicas reach
// (a barrier or a save inside `if (rank == 0)`) fails at once on every
// replica, naming where each waits, instead of waiting out the timeout.
TEST_F(XlaReplicasTest, ReplicasThatWaitApartFailAtOnceSayingWhere) {
  ReplicaGroup replicas({0, 1}, std::chrono::minutes(10));
  const std::vector<std::string> errors = on_replicas(replicas, [&](int r) {
    Group group(replicas.backend(r));
    if (r == 0) group.barrier();           // only rank 0 reaches it
    else strata::xla::mark_step();         // rank 1 ends its step
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("[xla] the replicas wait at different points and none can go on: replica 0 (xla:0) "
                             "at a barrier, replica 1 (xla:1) at the end of a step: every rank must reach each "
                             "collective"),
              std::string::npos)
        << "replica " << r << ": " << errors[r];
  }
}

TEST_F(XlaReplicasTest, AReplicaThatWaitsForOneWhoseWorkEndedFailsAtOnce) {
  ReplicaGroup replicas({0, 1}, std::chrono::minutes(10));
  std::atomic<bool> finished{false};
  const std::vector<std::string> errors = on_replicas(replicas, [&](int r) {
    Group group(replicas.backend(r));
    if (r == 1) {
      replicas.finish(1);
      finished = true;
      return;
    }
    while (!finished) std::this_thread::yield();
    group.barrier();
  });
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[0].find("[xla] replica 0 (xla:0) at a barrier waits for replica 1 (xla:1), whose work has ended"),
            std::string::npos)
      << errors[0];
}

}  // namespace
