// comm::Group's own behaviour, in one process, over a scripted two-rank
// backend (the peer's contribution is a fixed tensor): call order of async
// work, mean as sum-then-divide, errors rethrown from wait(), fail-fast
// after a failure, argument checks, statistics.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "strata/comm/group.h"
#include "strata/core/error.h"

namespace strata::comm {
namespace {

using std::chrono::seconds;

/// Rank 0 of two; the other rank always contributes `peer` to all_reduce.
/// Records every call; `gate` (when set) blocks the first call until opened;
/// `fail_on` makes the call with that number throw a CommError.
class ScriptedBackend final : public Backend {
 public:
  at::Tensor peer;
  int fail_on = -1;
  bool gate = false;

  std::string name() const override { return "scripted"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::chrono::milliseconds timeout() const override { return seconds(10); }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    record("all_reduce " + to_string(op));
    if (op == ReduceOp::kSum) t.add_(peer.to(t.scalar_type()).view_as(t));
  }
  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    record("all_gather");
    out.view(-1).narrow(0, 0, in.numel()).copy_(in.reshape(-1));
    out.view(-1).narrow(0, in.numel(), in.numel()).copy_(in.reshape(-1));
  }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    record("reduce_scatter " + to_string(op));
    out.view(-1).copy_(in.reshape(-1).narrow(0, 0, out.numel()).mul(2));
  }
  void broadcast(at::Tensor&, int src) override { record("broadcast " + std::to_string(src)); }
  void barrier() override { record("barrier"); }

  void open_gate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate = false;
    cv_.notify_all();
  }
  bool wait_until_blocked() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(10), [&] { return blocked_; });
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  void record(const std::string& call) {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back(call);
    threads_.push_back(std::this_thread::get_id());
    if (gate) {
      blocked_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, seconds(10), [&] { return !gate; });
    }
    if (static_cast<int>(calls_.size()) == fail_on) throw CommError("[scripted] peer vanished");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;
  std::vector<std::string> calls_;
  std::vector<std::thread::id> threads_;
};

TEST(Group, DefaultGroupIsOneLocalRank) {
  Group g;
  EXPECT_EQ(g.backend_name(), "local");
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.size(), 1);
  at::Tensor t = at::arange(4, at::kFloat);
  g.all_reduce(t);
  EXPECT_TRUE(t.equal(at::arange(4, at::kFloat)));
  EXPECT_EQ(g.all_gather(at::scalar_tensor(3.0)).sizes(), at::IntArrayRef({1}));
}

TEST(Group, MeanIsTheSumDividedBySizeWithFloorDivisionForIntegers) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::tensor({0, 0, 1, -4}, at::kLong);
  Group g(backend);
  at::Tensor ints = at::tensor({-3, 3, 4, 1}, at::kInt);  // sums -3, 3, 5, -3
  g.all_reduce(ints, ReduceOp::kMean);
  EXPECT_TRUE(ints.equal(at::tensor({-2, 1, 2, -2}, at::kInt))) << ints;
  at::Tensor floats = at::tensor({-3, 3, 4, 1}, at::kFloat);
  g.all_reduce(floats);  // default op: mean
  EXPECT_TRUE(floats.equal(at::tensor({-1.5, 1.5, 2.5, -1.5}, at::kFloat))) << floats;
  // The backend only ever sees sum for a mean.
  EXPECT_EQ(backend->calls(), (std::vector<std::string>{"all_reduce sum", "all_reduce sum"}));
  at::Tensor rs = g.reduce_scatter(at::tensor({1.0, 2.0, 3.0, 4.0}).view({2, 2}), ReduceOp::kMean);
  EXPECT_TRUE(rs.equal(at::tensor({1.0, 2.0}).view({1, 2}))) << rs;  // (2 * row 0) / 2
  EXPECT_EQ(backend->calls().back(), "reduce_scatter sum");
}

TEST(Group, AsyncOperationsRunInCallOrderOnOneThread) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({3});
  backend->gate = true;
  Group g(backend);
  at::Tensor a = at::ones({3}), b = at::ones({2, 2}), out = at::empty({1, 2});
  WorkPtr w1 = g.all_reduce_async(a, ReduceOp::kMax);
  WorkPtr w2 = g.reduce_scatter_async(b, out, ReduceOp::kSum);
  WorkPtr w3 = g.broadcast_async(a, 1);
  ASSERT_TRUE(backend->wait_until_blocked());
  EXPECT_FALSE(w1->is_completed());
  EXPECT_FALSE(w3->is_completed());
  // A synchronous call queues behind the async ones.
  std::thread opener([&] { backend->open_gate(); });
  g.barrier("after async");
  opener.join();
  EXPECT_TRUE(w1->is_completed() && w2->is_completed() && w3->is_completed());
  EXPECT_EQ(backend->calls(),
            (std::vector<std::string>{"all_reduce max", "reduce_scatter sum", "broadcast 1", "barrier"}));
  g.synchronize();
}

TEST(Group, SynchronousCallsOnAnIdleGroupRunOnTheCallersThread) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::ones({2});
  Group g(backend);
  at::Tensor t = at::ones({2});
  g.all_reduce(t, ReduceOp::kSum);
  g.barrier("in place");
  at::Tensor gathered = g.all_gather(t);
  g.all_reduce_async(t, ReduceOp::kMax)->wait();
  EXPECT_TRUE(t.equal(at::full({2}, 2.0))) << t;
  EXPECT_TRUE(gathered.equal(at::full({2, 2}, 2.0))) << gathered;
  const std::vector<std::thread::id> threads = backend->threads();
  ASSERT_EQ(threads.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(threads[i], std::this_thread::get_id()) << "synchronous call " << i;
  EXPECT_NE(threads[3], std::this_thread::get_id()) << "an async call runs on the group's worker";
}

TEST(Group, BackendErrorIsRethrownFromWaitAndLaterCallsFailFast) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({2});
  backend->fail_on = 2;
  Group g(backend);
  at::Tensor t = at::ones({2});
  WorkPtr ok = g.all_reduce_async(t, ReduceOp::kSum);
  WorkPtr bad = g.all_reduce_async(t, ReduceOp::kSum);
  WorkPtr later = g.broadcast_async(t, 0);
  ok->wait();
  try {
    bad->wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "[comm] all_reduce #2: [scripted] peer vanished");
  }
  try {
    later->wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(),
                 "[comm] broadcast #3 not run: an earlier collective of this group failed (all_reduce #2: "
                 "[scripted] peer vanished); create a new group after a communication failure");
  }
  EXPECT_TRUE(bad->is_completed());
  EXPECT_EQ(backend->calls().size(), 2u) << "the call after the failure never reached the backend";
  g.synchronize();  // both errors were already rethrown by wait()
}

TEST(Group, SynchronizeRethrowsAnErrorNobodyWaitedFor) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({2});
  backend->fail_on = 1;
  Group g(backend);
  g.all_reduce_async(at::ones({2}), ReduceOp::kSum);
  EXPECT_THROW(g.synchronize(), CommError);
  EXPECT_NO_THROW(g.synchronize()) << "an error is reported once";
}

TEST(Group, RejectsUnsupportedDtypesAndBadShapesWithoutBreakingTheGroup) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({3});
  Group g(backend);
  at::Tensor flags = at::ones({3}, at::kBool);
  try {
    g.all_reduce(flags);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] all_reduce: dtype Bool is not supported; use float32, float64, bfloat16, float16, int32 or int64");
  }
  try {
    g.reduce_scatter(at::ones({3, 2}));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] reduce_scatter: the first dimension of the input (shape [3, 2]) must be divisible by the group size 2");
  }
  at::Tensor t = at::ones({3});
  try {
    g.broadcast(t, 2);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] broadcast: source rank 2 is outside the group (size 2)");
  }
  try {
    g.all_gather_segmented_async(at::ones({5}), at::empty({10}), {2, 2});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] all_gather_segmented: the segments sum to 4 elements, but this rank's shard has 5");
  }
  try {
    g.reduce_scatter_segmented_async(at::ones({6}), at::empty({3}), {4, -1});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] reduce_scatter_segmented: a segment length is -1; lengths must be >= 0");
  }
  try {
    g.all_gather_segmented_async(at::ones({3}), at::empty({5}), {3});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "[comm] all_gather_segmented: input and output must be contiguous and the output hold 6 "
                           "elements (size() * input.numel()), got 5");
  }
  g.all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(t.equal(at::ones({3})));
}

TEST(Group, StatsCountCallsAndBytesPerOperation) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({6});
  Group g(backend);
  EXPECT_EQ(g.stats().summary(), "no collectives");
  at::Tensor t = at::ones({6});  // 24 bytes
  g.all_reduce(t, ReduceOp::kSum);
  g.all_reduce(t, ReduceOp::kSum);
  g.all_gather(at::ones({2}, at::kDouble));
  g.barrier();
  CommStats s = g.stats();
  EXPECT_EQ(s.all_reduce.calls, 2);
  EXPECT_EQ(s.all_reduce.bytes, 48);
  EXPECT_EQ(s.all_gather.calls, 1);
  EXPECT_EQ(s.all_gather.bytes, 16);
  EXPECT_EQ(s.barrier.calls, 1);
  EXPECT_EQ(s.total().calls, 4);
  EXPECT_EQ(s.total().bytes, 64);
  const std::string summary = s.summary();
  EXPECT_EQ(summary.rfind("all_reduce 2x 48 B ", 0), 0u) << summary;
  EXPECT_NE(summary.find(" | all_gather 1x 16 B "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" | barrier 1x 0 B "), std::string::npos) << summary;
  g.reset_stats();
  EXPECT_EQ(g.stats().total().calls, 0);
}

TEST(Group, CopiesShareOneQueueAndOneDebugFlag) {
  auto backend = std::make_shared<ScriptedBackend>();
  backend->peer = at::zeros({1});
  Group a(backend);
  Group b = a;
  b.set_debug(true);
  EXPECT_TRUE(a.debug());
  b.set_debug(false);
  a.barrier();
  b.barrier();
  EXPECT_EQ(a.stats().barrier.calls, 2);
}

}  // namespace
}  // namespace strata::comm
