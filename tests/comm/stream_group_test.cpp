// comm::Group over a stream-ordered backend (Note [Stream-ordered
// backends] in backend.h), in one process on CPU: a stand-in backend
// queues each collective's effect on a pretend device stream and returns
// at once, and its Work's wait() plays the stream wait by running that
// queue up to the operation. Checks that Group calls such a backend on the
// caller's thread, takes its Work, applies means and layouts only after
// the wait (once), reports and records failures seen at wait time, runs
// the debug checks and byte transfers through it, and leaves barrier
// finished. The NCCL backend itself is tested in nccl_test.cpp (GPU only).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <mutex>
#include <thread>

#include "strata/comm/group.h"
#include "strata/core/error.h"
#include "support/errors.h"

namespace strata::comm {
namespace {

using std::chrono::seconds;
using testing::error_message;

/// Rank 0 of two. Rank 1 contributes `peer` to reductions, its input plus
/// `gather_offset` to all_gather, and a tensor of -1 when it is the
/// broadcast source.
class FakeStreamBackend final : public Backend {
 public:
  at::Tensor peer;
  int64_t gather_offset = 0;
  bool fail_waits = false;

  std::string name() const override { return "fake-stream"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::chrono::milliseconds timeout() const override { return seconds(10); }
  bool stream_ordered() const override { return true; }

  WorkPtr take_work() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++taken_;
    return std::exchange(last_, nullptr);
  }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    at::Tensor target = t, other = peer;
    enqueue("all_reduce " + to_string(op), [target, other, op]() mutable {
      at::Tensor p = other.to(target.scalar_type()).view_as(target);
      if (op == ReduceOp::kSum) target.add_(p);
      else if (op == ReduceOp::kMax) target.copy_(at::maximum(target, p));
    });
  }
  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    at::Tensor source = in, target = out;
    const int64_t offset = gather_offset;
    enqueue("all_gather", [source, target, offset]() mutable {
      target.view(-1).narrow(0, 0, source.numel()).copy_(source.reshape(-1));
      target.view(-1).narrow(0, source.numel(), source.numel()).copy_(source.reshape(-1).add(offset));
    });
  }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    at::Tensor source = in, target = out;
    enqueue("reduce_scatter " + to_string(op), [source, target]() mutable {
      target.view(-1).copy_(source.reshape(-1).narrow(0, 0, target.numel()).mul(2));
    });
  }
  void broadcast(at::Tensor& t, int src) override {
    at::Tensor target = t;
    enqueue("broadcast " + std::to_string(src), [target, src]() mutable {
      if (src == 1) target.fill_(-1);
    });
  }
  /// Blocks the host until the stream drained, as a real one does.
  void barrier() override {
    record("barrier");
    run_until(stream_.size());
  }

  /// Runs the pretend stream up to and including operation `index`.
  void run_until(size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    while (ran_ < index) stream_[ran_++]();
  }
  size_t ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }
  int taken() {
    std::lock_guard<std::mutex> lock(mu_);
    return taken_;
  }
  int waits() {
    std::lock_guard<std::mutex> lock(mu_);
    return waits_;
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
  class FakeWork final : public Work {
   public:
    FakeWork(FakeStreamBackend* backend, size_t index) : backend_(backend), index_(index) {}
    void wait() override {
      {
        std::lock_guard<std::mutex> lock(backend_->mu_);
        ++backend_->waits_;
        if (backend_->fail_waits) throw TimeoutError("[fake] operation timed out; missing rank 1");
      }
      backend_->run_until(index_);
    }
    bool is_completed() const override { return backend_->ran() >= index_; }

   private:
    FakeStreamBackend* backend_;
    size_t index_;
  };

  void record(const std::string& call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    threads_.push_back(std::this_thread::get_id());
  }
  void enqueue(const std::string& call, std::function<void()> effect) {
    record(call);
    std::lock_guard<std::mutex> lock(mu_);
    stream_.push_back(std::move(effect));
    last_ = std::make_shared<FakeWork>(this, stream_.size());
  }

  std::mutex mu_;
  std::vector<std::function<void()>> stream_;
  size_t ran_ = 0;
  WorkPtr last_;
  int taken_ = 0;
  int waits_ = 0;
  std::vector<std::string> calls_;
  std::vector<std::thread::id> threads_;
};

TEST(StreamOrderedGroup, CallsEnqueueOnTheCallersThreadInCallOrder) {
  auto backend = std::make_shared<FakeStreamBackend>();
  backend->peer = at::ones({4});
  Group g(backend);
  at::Tensor a = at::zeros({4}), b = at::zeros({4});
  WorkPtr first = g.all_reduce_async(a, ReduceOp::kSum);
  std::thread other([&] {
    at::Tensor c = at::zeros({4});
    g.all_reduce(c, ReduceOp::kMax);
  });
  other.join();
  WorkPtr third = g.broadcast_async(b, 1);
  const std::vector<std::thread::id> threads = backend->threads();
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[0], std::this_thread::get_id());
  EXPECT_NE(threads[1], std::this_thread::get_id());  // the other caller's own thread, no worker
  EXPECT_EQ(threads[2], std::this_thread::get_id());
  EXPECT_EQ(backend->calls(), (std::vector<std::string>{"all_reduce sum", "all_reduce max", "broadcast 1"}));
  EXPECT_EQ(backend->taken(), 3);
  // The synchronous call waited (ran the stream through its operation),
  // which ordered the earlier one too; the last is still pending.
  EXPECT_TRUE(first->is_completed());
  EXPECT_FALSE(third->is_completed());
  third->wait();
  EXPECT_TRUE(b.equal(at::full({4}, -1.0f))) << b;
  first->wait();
  EXPECT_TRUE(a.equal(at::ones({4}))) << a;
}

TEST(StreamOrderedGroup, MeanAndLayoutAreAppliedAfterTheWaitAndOnlyOnce) {
  auto backend = std::make_shared<FakeStreamBackend>();
  backend->peer = at::tensor({1.0f, 3.0f, 5.0f, 7.0f, 9.0f, 11.0f});
  Group g(backend);
  at::Tensor base = at::zeros({3, 2});
  at::Tensor view = base.t();  // non-contiguous (2, 3)
  view.copy_(at::tensor({3.0f, 5.0f, 7.0f, 9.0f, 11.0f, 13.0f}).view({2, 3}));
  at::Tensor before = base.clone();
  WorkPtr work = g.all_reduce_async(view, ReduceOp::kMean);
  EXPECT_FALSE(work->is_completed());
  EXPECT_TRUE(base.equal(before)) << "the result must not appear before the stream ran";
  work->wait();
  work->wait();  // a second wait must not divide again
  at::Tensor want = at::tensor({2.0f, 4.0f, 6.0f, 8.0f, 10.0f, 12.0f}).view({2, 3});
  EXPECT_TRUE(view.equal(want)) << view;
  EXPECT_TRUE(base.equal(want.t())) << base;
  EXPECT_EQ(backend->waits(), 2);

  at::Tensor ints = at::tensor({-3, 3, 4, 1}, at::kInt);
  backend->peer = at::tensor({0, 0, 1, -4}, at::kInt);
  g.all_reduce(ints, ReduceOp::kMean);  // synchronous: the result is there on return
  EXPECT_TRUE(ints.equal(at::tensor({-2, 1, 2, -2}, at::kInt))) << ints;

  at::Tensor out = at::zeros({2}, at::kFloat);
  WorkPtr rs = g.reduce_scatter_async(at::tensor({1.0f, 2.0f, 3.0f, 4.0f}), out, ReduceOp::kMean);
  EXPECT_TRUE(out.equal(at::zeros({2}))) << out;
  rs->wait();
  EXPECT_TRUE(out.equal(at::tensor({1.0f, 2.0f}))) << out;  // (2 * first half) / 2
}

TEST(StreamOrderedGroup, ErrorSeenAtWaitNamesTheCallAndLaterCallsFailFast) {
  auto backend = std::make_shared<FakeStreamBackend>();
  backend->peer = at::zeros({2});
  Group g(backend);
  at::Tensor t = at::ones({2});
  g.all_reduce(t);  // #1
  backend->fail_waits = true;
  WorkPtr work = g.all_reduce_async(t, ReduceOp::kSum);  // #2
  EXPECT_EQ(error_message<TimeoutError>([&] { work->wait(); }),
            "[comm] all_reduce #2: [fake] operation timed out; missing rank 1");
  // The same error again from the same Work, and not once more from synchronize().
  EXPECT_EQ(error_message<TimeoutError>([&] { work->wait(); }),
            "[comm] all_reduce #2: [fake] operation timed out; missing rank 1");
  EXPECT_NO_THROW(g.synchronize());
  backend->fail_waits = false;
  EXPECT_EQ(error_message<CommError>([&] { g.all_gather(t); }),
            "[comm] all_gather #3 not run: an earlier collective of this group failed (all_reduce #2: [fake] "
            "operation timed out; missing rank 1); create a new group after a communication failure");
  EXPECT_EQ(backend->calls().size(), 2u) << "the failed group must not reach the backend again";
}

TEST(StreamOrderedGroup, SynchronizeWaitsForEveryPendingOperationAndReportsAnUnseenError) {
  auto backend = std::make_shared<FakeStreamBackend>();
  backend->peer = at::full({3}, 2.0f);
  Group g(backend);
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(at::full({3}, static_cast<float>(i)));
    works.push_back(g.all_reduce_async(tensors.back(), ReduceOp::kMean));
  }
  g.synchronize();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(works[i]->is_completed());
    EXPECT_TRUE(tensors[i].equal(at::full({3}, (i + 2.0f) / 2))) << tensors[i];
  }
  EXPECT_EQ(g.stats().all_reduce.calls, 4);
  EXPECT_EQ(g.stats().all_reduce.bytes, 4 * 3 * 4);

  backend->fail_waits = true;
  WorkPtr lost = g.broadcast_async(tensors[0], 1);
  EXPECT_THROW(g.synchronize(), TimeoutError);
  EXPECT_THROW(g.barrier(), CommError);
}

TEST(StreamOrderedGroup, DebugChecksExchangeDescriptorsThroughTheBackendAndCatchAMismatch) {
  auto backend = std::make_shared<FakeStreamBackend>();
  backend->peer = at::ones({2});
  Group g(backend, GroupOptions().with_debug(true));
  at::Tensor t = at::ones({2});
  g.all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(t.equal(at::full({2}, 2.0f))) << t;
  EXPECT_EQ(backend->calls(), (std::vector<std::string>{"all_gather", "all_reduce sum"}));
  // Rank 1's descriptor now reads one higher in every word: another
  // operation (all_gather = all_reduce + 1) at another call number.
  backend->gather_offset = 1;
  EXPECT_EQ(error_message<CommError>([&] { g.all_reduce(t, ReduceOp::kSum); }),
            "[comm] all_reduce #2: operations differ across ranks: rank 0 all_reduce, rank 1 all_gather; "
            "call numbers differ across ranks: rank 0 #2, rank 1 #3");
  // A mismatch leaves the group usable.
  backend->gather_offset = 0;
  g.all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(t.equal(at::full({2}, 3.0f))) << t;
}

TEST(StreamOrderedGroup, ObjectsAndBarrierGoThroughTheStream) {
  auto backend = std::make_shared<FakeStreamBackend>();
  Group g(backend);
  EXPECT_EQ(g.broadcast_object<std::string>("from rank 0", 0), "from rank 0");
  EXPECT_EQ(g.all_gather_object(std::vector<int>{1, 2, 3}), (std::vector<std::vector<int>>{{1, 2, 3}, {1, 2, 3}}));
  at::Tensor t = at::zeros({5});
  WorkPtr pending = g.broadcast_async(t, 1);
  g.barrier("drain");
  EXPECT_TRUE(pending->is_completed()) << "barrier returns with the stream drained";
  EXPECT_EQ(backend->calls().back(), "barrier");
  EXPECT_EQ(g.stats().barrier.calls, 1);
  pending->wait();
  EXPECT_TRUE(t.equal(at::full({5}, -1.0f))) << t;
}

}  // namespace
}  // namespace strata::comm
