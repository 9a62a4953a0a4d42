// DDP's gradient buckets on 2 ranks: gradients are views of the buckets
// (no copy in or out), the bucket order is rebuilt once from rank 0's
// first backward, and set_to_none, a replaced .grad, zeroed gradients and
// no_sync accumulation all give exactly the average over ranks of what
// each rank computes alone (each scaled by 1 / world size, then summed, as
// DDP and PyTorch's DDP do).
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/strategies/ddp.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::strategies::DDPOptions;
using strata::strategies::DDPStrategy;

constexpr int64_t kWidth = 512;  // a 512 x 512 fp32 weight is exactly 1 MB: one bucket each

// Three 1 MB weights a, b, c applied in an order chosen per call, and one
// small parameter no forward uses.
struct Chain : torch::nn::Module {
  at::Tensor a, b, c, unused;
  Chain() {
    a = register_parameter("a", at::randn({kWidth, kWidth}) * 0.05);
    b = register_parameter("b", at::randn({kWidth, kWidth}) * 0.05);
    c = register_parameter("c", at::randn({kWidth, kWidth}) * 0.05);
    unused = register_parameter("unused", at::zeros({4}));
  }
  // `order` names the weights in the order they are applied.
  at::Tensor loss(const at::Tensor& x, const std::string& order) {
    at::Tensor y = x;
    for (char w : order) y = at::tanh(at::matmul(y, (w == 'a' ? a : w == 'b' ? b : c).t()));
    return y.pow(2).mean();
  }
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

std::string layout_text(const std::vector<std::vector<size_t>>& layout) {
  std::ostringstream out;
  for (const auto& bucket : layout) {
    out << "{";
    for (size_t i : bucket) out << i << (i == bucket.back() ? "" : ",");
    out << "}";
  }
  return out.str();
}

STRATA_WORKER(ddp_bucket_views) {
  DDPStrategy strategy(strata::strategies::cpu_accelerator(), std::nullopt, DDPOptions().with_bucket_cap_mb(1));
  strategy.setup_environment();
  const int rank = strategy.global_rank();
  const int world = strategy.world_size();
  // Rank 0 applies c, b, a (so backward makes a's gradient first), rank 1
  // a, b, c (c's first, as reverse registration order guesses).
  const std::string order = rank == 0 ? "cba" : "abc";

  at::manual_seed(100 + rank);  // different weights per rank: setup_module broadcasts rank 0's
  auto model = std::make_shared<Chain>();
  strategy.setup_module(model);
  auto reference = std::make_shared<Chain>();
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters()) reference->named_parameters()[item.key()].copy_(item.value());
  }
  const std::vector<at::Tensor> params = model->parameters();
  const std::vector<at::Tensor> ref_params = reference->parameters();
  check(layout_text(strategy.bucket_layout(*model)) == "{3}{2}{1}{0}",
        "initial layout (reverse registration, 1 MB buckets): " + layout_text(strategy.bucket_layout(*model)));

  // Each rank's gradients alone, scaled, then summed over ranks: DDP's average.
  auto expected_grad = [&](size_t i) {
    at::Tensor g = ref_params[i].grad().mul(1.0 / world);
    strategy.group().all_reduce(g, strata::comm::ReduceOp::kSum);
    return g;
  };
  auto check_grads = [&](const std::string& step) {
    auto layout = strategy.bucket_layout(*model);
    auto buffers = strategy.bucket_buffers(*model);
    for (size_t i = 0; i < 3; ++i) {
      const at::Tensor& grad = params[i].grad();
      check(grad.defined(), step + ": parameter " + std::to_string(i) + " has no gradient");
      check(at::equal(grad, expected_grad(i)), step + ": gradient " + std::to_string(i) + " is not the average");
      bool is_view = false;
      for (size_t b = 0; b < layout.size(); ++b) {
        for (size_t i2 : layout[b]) {
          if (i2 != i) continue;
          int64_t offset = 0;
          for (size_t k : layout[b]) {
            if (k == i) break;
            offset += params[k].numel();
          }
          is_view = grad.is_alias_of(buffers[b]) &&
                    grad.data_ptr<float>() == buffers[b].data_ptr<float>() + offset;
        }
      }
      check(is_view, step + ": gradient " + std::to_string(i) + " is not a view of its bucket slot");
    }
    check(!params[3].grad().defined(), step + ": a parameter no rank used got a gradient");
  };
  auto set_to_none = [](const std::vector<at::Tensor>& ps) {
    for (at::Tensor p : ps) p.mutable_grad().reset();
  };
  auto input = [&](int64_t step) {
    at::Generator gen = at::detail::createCPUGenerator(1000 * step + rank);
    return at::randn({8, kWidth}, gen);
  };

  // 1. First backward: gradients start undefined; the order is rebuilt
  //    from rank 0's (a, b, c, then the unused one), on both ranks.
  strategy.backward(model->loss(input(1), order));
  reference->loss(input(1), order).backward();
  check_grads("step 1");
  check(layout_text(strategy.bucket_layout(*model)) == "{0}{1}{2}{3}",
        "rebuilt layout (rank 0's ready order): " + layout_text(strategy.bucket_layout(*model)));

  // 2. An optimizer's zero_grad (LibTorch's detaches, then sets to none),
  //    then a backward: the zeroed slots are the gradients autograd
  //    accumulates into; no second rebuild.
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
  optimizer.zero_grad();
  check(!params[0].grad().defined(), "step 2: zero_grad left a gradient");
  set_to_none(ref_params);
  strategy.backward(model->loss(input(2), order));
  reference->loss(input(2), order).backward();
  check_grads("step 2 (set_to_none)");
  check(layout_text(strategy.bucket_layout(*model)) == "{0}{1}{2}{3}", "the layout changed after step 2");

  // 3. zero_grad without set_to_none zeroes the views in place.
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) params[i].mutable_grad().zero_();
    if (ref_params[i].grad().defined()) ref_params[i].mutable_grad().zero_();
  }
  strategy.backward(model->loss(input(3), order));
  reference->loss(input(3), order).backward();
  check_grads("step 3 (zeroed in place)");
  set_to_none({params[3]});
  set_to_none({ref_params[3]});

  // 4. User code replaces a .grad: it is added to, moved into its slot, and
  //    the parameter points at the slot again.
  set_to_none(params);
  set_to_none(ref_params);
  params[0].mutable_grad() = at::full_like(params[0], 0.5);
  ref_params[0].mutable_grad() = at::full_like(ref_params[0], 0.5);
  strategy.backward(model->loss(input(4), order));
  reference->loss(input(4), order).backward();
  check_grads("step 4 (replaced .grad)");

  // 5. Gradient accumulation: a backward under no_sync, then a synchronised one.
  set_to_none(params);
  set_to_none(ref_params);
  {
    strata::strategies::Scope no_sync = strategy.no_backward_sync(*model);
    strategy.backward(model->loss(input(5), order));
    check(!params[0].grad().is_alias_of(strategy.bucket_buffers(*model)[0]),
          "step 5: no_sync must not have touched the buckets");
  }
  strategy.backward(model->loss(input(6), order));
  reference->loss(input(5), order).backward();
  reference->loss(input(6), order).backward();
  check_grads("step 5 (no_sync accumulation)");

  std::cout << "bucket views ok on rank " << rank << std::endl;
  strategy.teardown();
  return 0;
}

TEST(DDPBucketsTest, GradientsAreBucketViewsAndTheOrderIsRebuiltFromRankZero) {
  auto run = strata::testing::run_workers(
      2, "ddp_bucket_views", {}, strata::runtime::LaunchOptions().with_timeout_s(240));
  ASSERT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  EXPECT_NE(run.output.find("bucket views ok on rank 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("bucket views ok on rank 1"), std::string::npos) << run.output;
}

}  // namespace
