// DataLoader (batching in sampler order, epochs, saved positions) and
// DeviceLoader (background prefetch: order, errors, restarts, shutdown).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/dataset.h"
#include "strata/data/device_loader.h"
#include "strata/data/distributed_sampler.h"
#include "strata/data/loader.h"
#include "support/errors.h"

namespace {
using namespace strata::data;

// Example i is input [i, i] (float) and target i (int64), so a batch tells
// which examples it holds.
std::shared_ptr<const Dataset> numbered(int64_t n) {
  auto ids = at::arange(n, at::kLong);
  return std::make_shared<TensorDataset>(ids.to(at::kFloat).unsqueeze(1).repeat({1, 2}), ids);
}

std::vector<int64_t> ids_of(const Batch& b) {
  auto t = b.target.contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

std::vector<std::vector<int64_t>> drain(Loader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (Batch& b : loader) out.push_back(ids_of(b));
  return out;
}

// ---- DataLoader -------------------------------------------------------------

TEST(DataLoaderTest, BatchesStackExamplesInSamplerOrder) {
  auto ds = numbered(10);
  DistributedSampler sampler(10, 3, 1, false);  // indices 1, 4, 7, 0
  DataLoader loader(ds, sampler, 3);
  EXPECT_EQ(loader.size(), 2u);
  auto batches = drain(loader);
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{1, 4, 7}, {0}}));
  DataLoader first(ds, DistributedSampler(10, 1, 0, false), 4);
  auto b = first.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->input.sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(at::equal(b->input.select(1, 1), at::arange(4, at::kFloat)));
  EXPECT_EQ(b->size(), 4);
  DataLoader dropping(ds, sampler, 3, /*drop_last=*/true);
  EXPECT_EQ(dropping.size(), 1u);
  EXPECT_EQ(drain(dropping), (std::vector<std::vector<int64_t>>{{1, 4, 7}}));
}

TEST(DataLoaderTest, ShuffledEpochsFollowTheSamplerAndANewIterationStartsOver) {
  auto ds = numbered(20);
  DataLoader loader(ds, 5, /*shuffle=*/true, /*seed=*/3);
  DistributedSampler reference(20, 1, 0, true, 3);
  auto expect_epoch = [&](uint64_t epoch) {
    reference.set_epoch(epoch);
    auto order = reference.indices();
    std::vector<std::vector<int64_t>> expected;
    for (size_t k = 0; k < 4; ++k) expected.emplace_back(order.begin() + 5 * k, order.begin() + 5 * k + 5);
    return expected;
  };
  EXPECT_EQ(drain(loader), expect_epoch(0));
  // Early break, then a new range-for: the pass starts from batch 0 again.
  for (Batch& b : loader) {
    (void)b;
    break;
  }
  EXPECT_EQ(drain(loader), expect_epoch(0));
  loader.set_epoch(1);
  EXPECT_EQ(drain(loader), expect_epoch(1));
  EXPECT_NE(expect_epoch(1), expect_epoch(0));
}

TEST(DataLoaderTest, ARestoredStateContinuesWithTheNextBatch) {
  auto ds = numbered(30);
  DataLoader original(ds, 4, true, 9);
  original.set_epoch(2);
  auto full = drain(original);
  ASSERT_EQ(full.size(), 8u);

  original.reset();
  for (int i = 0; i < 3; ++i) original.next();
  LoaderState saved = original.state();
  EXPECT_EQ(saved, (LoaderState{2, 3}));
  nlohmann::json j = saved;
  EXPECT_EQ(j.dump(), R"({"epoch":2,"position":3})");

  DataLoader resumed(ds, 4, true, 9);
  resumed.load_state(j.get<LoaderState>());
  resumed.set_epoch(2);  // the usual loop calls this; the same epoch keeps the position
  auto rest = drain(resumed);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(full.begin() + 3, full.end()));
  EXPECT_EQ(resumed.state(), (LoaderState{2, 8}));
  // The pass after the resumed one is a whole epoch again.
  EXPECT_EQ(drain(resumed), full);

  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { resumed.load_state({0, 9}); }),
            "[data] cannot resume at batch 9 of an epoch of 8 batches (was the batch size or world size changed?)");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { nlohmann::json{{"epoch", 1}}.get<LoaderState>(); }),
            R"([data] loader state needs a non-negative integer 'position', got {"epoch":1})");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { nlohmann::json{{"epoch", -1}, {"position", 0}}.get<LoaderState>(); }),
            R"([data] loader state needs a non-negative integer 'epoch', got {"epoch":-1,"position":0})");
  EXPECT_EQ((nlohmann::json{{"epoch", 4}, {"position", 1}}.get<LoaderState>()), (LoaderState{4, 1}));
}

TEST(DataLoaderTest, BadArgumentsAreRejected) {
  auto ds = numbered(10);
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { DataLoader(ds, DistributedSampler(9, 1, 0), 2); }),
            "[data] the sampler was built for 9 examples but the dataset has 10");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { DataLoader(ds, 0); }), "[data] batch_size must be >= 1, got 0");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { DataLoader(nullptr, 2); }), "[data] DataLoader needs a dataset, got null");
}

// ---- DeviceLoader -------------------------------------------------------------

TEST(DeviceLoaderTest, YieldsExactlyTheWrappedLoadersBatchesInOrder) {
  auto inner = std::make_shared<DataLoader>(numbered(50), 4, true, 1);
  auto expected = drain(*inner);
  DeviceLoader loader(inner, at::kCPU, 2);
  EXPECT_EQ(loader.size(), inner->size());
  EXPECT_TRUE(loader.is_device_loader());
  EXPECT_FALSE(inner->is_device_loader());
  std::vector<std::vector<int64_t>> got;
  for (Batch& b : loader) {
    EXPECT_EQ(b.input.device(), at::Device(at::kCPU));
    got.push_back(ids_of(b));
  }
  EXPECT_EQ(got, expected);
  EXPECT_FALSE(loader.next().has_value());  // the pass is over
  EXPECT_EQ(drain(loader), expected);        // a new iteration is a new pass
}

// A loader whose batches are numbered 0, 1, ...; it throws at `fail_at`
// and records how many batches were asked for.
class CountingLoader : public Loader {
 public:
  CountingLoader(size_t n, size_t fail_at) : n_(n), fail_at_(fail_at) {}
  size_t size() const override { return n_; }
  void reset() override { pos_ = 0; }
  std::optional<Batch> next() override {
    if (pos_ == fail_at_) throw std::out_of_range("batch " + std::to_string(pos_) + " is corrupt");
    if (pos_ >= n_) return std::nullopt;
    auto t = at::full({1}, static_cast<int64_t>(pos_++), at::kLong);
    {
      std::lock_guard<std::mutex> lock(m_);
      ++produced_;
    }
    cv_.notify_all();
    return Batch{t.to(at::kFloat), t};
  }
  // Waits (up to 30 s) until `count` batches were produced in total.
  bool wait_produced(size_t count) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return produced_ >= count; });
  }

 private:
  size_t n_, fail_at_, pos_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  size_t produced_ = 0;
};

TEST(DeviceLoaderTest, AnErrorInTheProducerIsRethrownInTheConsumerWithItsTypeAndMessage) {
  auto inner = std::make_shared<CountingLoader>(10, 3);
  DeviceLoader loader(inner, at::kCPU);
  std::vector<std::vector<int64_t>> got;
  try {
    for (Batch& b : loader) got.push_back(ids_of(b));
    FAIL() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "batch 3 is corrupt");
  }
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}}));
  EXPECT_FALSE(loader.next().has_value());
}

TEST(DeviceLoaderTest, BreakingEarlyThenIteratingAgainRestartsCleanly) {
  auto inner = std::make_shared<CountingLoader>(40, SIZE_MAX);
  DeviceLoader loader(inner, at::kCPU, 4);
  int seen = 0;
  for (Batch& b : loader) {
    EXPECT_EQ(ids_of(b), std::vector<int64_t>{seen});
    if (++seen == 5) break;
  }
  std::vector<std::vector<int64_t>> expected;
  for (int64_t i = 0; i < 40; ++i) expected.push_back({i});
  EXPECT_EQ(drain(loader), expected);
  loader.close();
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_EQ(drain(loader), expected);  // a new iteration after close() works
}

TEST(DeviceLoaderTest, DestroyingItWhileTheProducerWaitsOnAFullQueueDoesNotHang) {
  auto inner = std::make_shared<CountingLoader>(1000000, SIZE_MAX);
  auto loader = std::make_unique<DeviceLoader>(inner, at::kCPU, 2);
  ASSERT_EQ(ids_of(*loader->next()), std::vector<int64_t>{0});
  // 1 consumed + 2 queued: the producer now waits for room in the queue.
  ASSERT_TRUE(inner->wait_produced(3));
  // Destroy on another thread so that a hang fails the test instead of
  // blocking it (the thread is detached, never joined).
  auto destroyed = std::make_shared<std::promise<void>>();
  auto done = destroyed->get_future();
  std::thread([l = std::move(loader), destroyed]() mutable {
    l.reset();
    destroyed->set_value();
  }).detach();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
}

TEST(DeviceLoaderTest, ItsStateCountsOnlyBatchesTheConsumerReceivedAndResumesThere) {
  auto inner = std::make_shared<DataLoader>(numbered(40), 2, true, 5);
  inner->set_epoch(1);
  auto all = drain(*inner);
  ASSERT_EQ(all.size(), 20u);
  DeviceLoader loader(inner, at::kCPU, 8);
  loader.reset();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next().has_value());
  // The producer may be up to 8 batches ahead; those do not count.
  LoaderState saved = loader.state();
  EXPECT_EQ(saved, (LoaderState{1, 3}));

  auto fresh = std::make_shared<DataLoader>(numbered(40), 2, true, 5);
  DeviceLoader resumed(fresh, at::kCPU, 8);
  resumed.load_state(saved);
  resumed.set_epoch(1);
  EXPECT_EQ(drain(resumed), std::vector<std::vector<int64_t>>(all.begin() + 3, all.end()));
  EXPECT_EQ(resumed.state(), (LoaderState{1, 20}));
}

TEST(DeviceLoaderTest, LoadersWithoutStateSaySo) {
  DeviceLoader loader(std::make_shared<CountingLoader>(3, SIZE_MAX), at::kCPU);
  EXPECT_FALSE(loader.resumable());
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { loader.state(); }),
            "[data] the loader wrapped by this DeviceLoader cannot save its position");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { DeviceLoader(nullptr, at::kCPU); }),
            "[data] DeviceLoader needs a loader to wrap, got null");
}

}  // namespace

TEST(DeviceLoaderTest, EachPassStartsTheNextEpochWhenAskedAndExplicitEpochsAndRestoresWin) {
  auto ds = numbered(20);
  DistributedSampler reference(20, 1, 0, true, 3);
  auto expect_epoch = [&](uint64_t epoch, size_t from_batch = 0) {
    reference.set_epoch(epoch);
    auto order = reference.indices();
    std::vector<std::vector<int64_t>> expected;
    for (size_t k = from_batch; k < 4; ++k) expected.emplace_back(order.begin() + 5 * k, order.begin() + 5 * k + 5);
    return expected;
  };
  auto make = [&] {
    auto loader = std::make_shared<DeviceLoader>(std::make_shared<DataLoader>(ds, 5, true, 3), at::kCPU, 2);
    loader->advance_epoch_each_pass(true);
    return loader;
  };
  auto loader = make();
  EXPECT_EQ(drain(*loader), expect_epoch(0));
  EXPECT_EQ(loader->state(), (LoaderState{1, 0})) << "a finished pass: the next one starts epoch 1";
  EXPECT_EQ(drain(*loader), expect_epoch(1));
  for (Batch& b : *loader) {  // an early break still counts as a pass (as in Lightning)
    (void)b;
    break;
  }
  EXPECT_EQ(drain(*loader), expect_epoch(3));
  loader->set_epoch(7);  // explicit control wins over the advance
  EXPECT_EQ(drain(*loader), expect_epoch(7));
  EXPECT_EQ(drain(*loader), expect_epoch(8));

  // Mid-epoch state, restored into a new loader: the pass continues there,
  // and the one after it starts the next epoch.
  auto first = make();
  drain(*first);
  auto it = first->begin();
  ++it;  // epoch 1: batches 0 and 1 consumed
  const LoaderState saved = first->state();
  EXPECT_EQ(saved, (LoaderState{1, 2}));
  auto resumed = make();
  resumed->load_state(saved);
  EXPECT_EQ(drain(*resumed), expect_epoch(1, 2));
  EXPECT_EQ(drain(*resumed), expect_epoch(2));

  // Without the option, passes repeat the epoch (a plain DeviceLoader).
  DeviceLoader plain(std::make_shared<DataLoader>(ds, 5, true, 3), at::kCPU, 2);
  EXPECT_EQ(drain(plain), expect_epoch(0));
  EXPECT_EQ(drain(plain), expect_epoch(0));
}
