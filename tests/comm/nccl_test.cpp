// The NCCL backend's own behaviour on CUDA devices (its conformance runs
// in conformance_test.cpp): it is stream-ordered on the group's device,
// refuses tensors elsewhere, orders each collective after the kernels that
// produce its input, and, with two GPUs, times out a call a peer never
// makes, naming that peer. Every test skips, saying why, without NCCL in
// the build or without enough GPUs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "nccl_skip.h"
#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/nccl/backend.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace strata::comm {
namespace {

using namespace std::chrono_literals;

using strata::testing::nccl_unavailable;

Group one_rank_group(GroupOptions options = {}) {
  runtime::TcpStoreOptions o;
  o.is_server = true;
  o.timeout = 30s;
  return Group(nccl::create(runtime::make_tcp_store(o), 0, 1, 30s), options);
}

TEST(NcclBackend, IsStreamOrderedOnTheCurrentCudaDevice) {
  if (std::string why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  Group g = one_rank_group();
  EXPECT_EQ(g.backend_name(), "nccl");
  EXPECT_EQ(g.device(), c10::Device(c10::kCUDA, 0));
}

TEST(NcclBackend, RefusesATensorOnAnotherDeviceAndStaysUsable) {
  if (std::string why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  Group g = one_rank_group();
  at::Tensor cpu = at::ones({3});
  EXPECT_EQ(testing::error_message<ConfigError>([&] { g.all_reduce(cpu); }),
            "[nccl] all_reduce: tensor is on cpu, but this NCCL group runs on cuda:0 (move the tensor there; CPU "
            "tensors need the gloo or shm backend)");
  at::Tensor gpu = at::ones({3}, at::TensorOptions().device(g.device()));
  g.all_reduce(gpu, ReduceOp::kSum);
  EXPECT_TRUE(gpu.cpu().equal(at::ones({3})));
}

// A long chain of kernels produces the input on the caller's stream; the
// collective, on the communication stream, must see the final values.
TEST(NcclBackend, CollectivesWaitForTheKernelsThatProduceTheirInput) {
  if (std::string why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  Group g = one_rank_group();
  const auto opts = at::TensorOptions(at::kFloat).device(g.device());
  at::Tensor a = at::full({2048, 2048}, 1.0f / 2048, opts);
  for (int i = 0; i < 16; ++i) a = at::matmul(a, a);  // stays 1/2048 everywhere
  at::Tensor input = at::zeros({1 << 20}, opts);
  input.copy_(a.flatten().narrow(0, 0, 1 << 20).mul(2048).add(at::arange(1 << 20, opts)));
  at::Tensor gathered = at::empty({1 << 20}, opts);
  WorkPtr work = g.all_gather_async(input, gathered);
  at::Tensor broadcasted = input.clone();
  WorkPtr second = g.broadcast_async(broadcasted, 0);
  work->wait();
  second->wait();
  at::Tensor want = at::arange(1 << 20, at::kFloat).add(1);
  EXPECT_TRUE(gathered.cpu().allclose(want)) << "the all_gather read its input before it was written";
  EXPECT_TRUE(broadcasted.cpu().allclose(want));
  torch::cuda::synchronize();
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(second->is_completed());
}

// Rank 1 never makes the all_reduce rank 0 makes; a CPU group (gloo) lets
// both ranks finish together afterwards.
STRATA_WORKER(nccl_peer_missing) {
  runtime::Environment env = runtime::Environment::from_env();
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(c10::Device(c10::kCUDA, env.local_rank));
  auto store = runtime::make_store(env, 60s);
  Group cpu(gloo::create(store, env.rank, env.world_size, 120s));
  Group g(nccl::create(store, env.rank, env.world_size, 3s));
  if (env.rank == 0) {
    at::Tensor t = at::ones({8}, at::TensorOptions().device(g.device()));
    WorkPtr work = g.all_reduce_async(t, ReduceOp::kSum);
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    while (!work->is_completed() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    try {
      work->wait();
      std::cerr << "FAILED: the all_reduce without a peer did not time out\n";
      return 1;
    } catch (const TimeoutError& e) {
      std::cout << "timeout: " << e.what() << "\n";
    }
  }
  cpu.barrier("after the timeout");
  return 0;
}

TEST(NcclBackend, CallAPeerNeverMakesTimesOutNamingThePeer) {
  if (std::string why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  testing::WorkersResult result = testing::run_workers(2, "nccl_peer_missing", {},
                                                       runtime::LaunchOptions().with_timeout_s(240));
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  EXPECT_NE(result.output.find("[nccl] all_reduce #1 timed out after 3000 ms on rank 0 of 2"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("missing rank 1"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace strata::comm
