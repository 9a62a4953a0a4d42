// DeviceLoader: a producer thread that prefetches batches from a wrapped
// loader onto the training device through a bounded queue.
#include "strata/data/device_loader.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "strata/core/error.h"

namespace strata::data {

DeviceLoader::DeviceLoader(std::shared_ptr<Loader> loader, at::Device device, size_t queue_depth)
    : loader_(std::move(loader)), device_(device), queue_depth_(queue_depth) {
  STRATA_CHECK(loader_ != nullptr, ConfigError, "[data] DeviceLoader needs a loader to wrap, got null");
  STRATA_CHECK(queue_depth_ >= 1, ConfigError, "[data] DeviceLoader queue_depth must be >= 1, got ",
               queue_depth_);
}

DeviceLoader::~DeviceLoader() { stop(); }

// Batches for the CPU, and batches already on the device, pass through.
Batch DeviceLoader::to_device(const Batch& batch) const { return batch.to(device_); }

// Note [One batch ahead]: page-locked host memory, so that the copy to the
// device can run asynchronously (from pageable memory a non_blocking copy
// is synchronous).
Batch DeviceLoader::pin(const Batch& batch) const {
  auto pinned = [](const at::Tensor& t) { return t.device().is_cpu() && !t.is_pinned() ? t.pin_memory() : t; };
  return {pinned(batch.input), pinned(batch.target), batch.count, batch.global_count};
}

std::optional<DeviceLoader::Item> DeviceLoader::pop(bool wait) {
  std::optional<Item> item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (wait) not_empty_.wait(lock, [&] { return !queue_.empty(); });
    if (queue_.empty()) return std::nullopt;
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  not_full_.notify_one();
  return item;
}

// Queues the copy of `item`'s batch to the device on the copy stream and
// records an event after it; returns at once.
DeviceLoader::Item DeviceLoader::start_copy(Item item) {
  if (!item.batch) return item;
  const Batch& batch = *item.batch;
  if (batch.input.device() == device_ && batch.target.device() == device_) return item;
  c10::impl::VirtualGuardImpl device_impl(device_.type());
  if (!copy_stream_) copy_stream_ = device_impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  c10::StreamGuard on_copy_stream(*copy_stream_);
  item.batch = batch.to(device_, /*non_blocking=*/true);
  item.copied = std::make_shared<c10::Event>(device_.type());
  item.copied->record(*copy_stream_);
  return item;
}

// The consumer's current stream waits for the copy (on the device, not on
// the host), and the batch's memory is marked as used by that stream.
void DeviceLoader::order_after_copy(const Item& item) const {
  if (!item.copied) return;
  c10::impl::VirtualGuardImpl device_impl(device_.type());
  const c10::Stream compute = device_impl.getStream(device_);
  item.copied->block(compute);
  for (const at::Tensor& t : {item.batch->input, item.batch->target}) {
    device_impl.recordDataPtrOnStream(t.storage().data_ptr(), compute);
  }
}

void DeviceLoader::produce() {
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        not_full_.wait(lock, [&] { return stop_requested_ || queue_.size() < queue_depth_; });
        if (stop_requested_) return;
      }
      std::optional<Batch> batch = loader_->next();
      Item item;
      if (batch) item.batch = staged() ? pin(*batch) : to_device(*batch);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(item));
      }
      not_empty_.notify_one();
      if (!batch) return;  // end of pass (the marker was queued)
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Item{std::nullopt, std::current_exception()});
    }
    not_empty_.notify_one();
  }
}

void DeviceLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  not_full_.notify_all();
  if (thread_.joinable()) thread_.join();
  ahead_.reset();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  stop_requested_ = false;
}

void DeviceLoader::reset() {
  stop();
  if (loader_->resumable() && !epoch_chosen_) epoch_ = loader_->state().epoch;
  if (advance_epoch_ && passes_ > 0 && !epoch_chosen_) loader_->set_epoch(++epoch_);
  epoch_chosen_ = false;
  ++passes_;
  loader_->reset();
  pass_start_ = loader_->resumable() ? loader_->state() : LoaderState{};
  consumed_ = 0;
  have_pass_ = true;
  phase_ = Phase::kRunning;
  thread_ = std::thread([this] { produce(); });
}

std::optional<Batch> DeviceLoader::next() {
  if (mark_step_) mark_step_();
  if (phase_ == Phase::kIdle) reset();
  if (phase_ != Phase::kRunning) return std::nullopt;
  Item item;
  if (ahead_) {
    item = std::move(*ahead_);
    ahead_.reset();
  } else {
    item = *pop(/*wait=*/true);
    if (staged()) item = start_copy(std::move(item));
  }
  if (item.batch) {
    // Note [One batch ahead]: start the next copy (when the producer has a
    // batch ready) so that it overlaps the step that uses this one.
    if (staged() && !ahead_) {
      if (std::optional<Item> next = pop(/*wait=*/false)) ahead_ = start_copy(std::move(*next));
    }
    order_after_copy(item);
    ++consumed_;
    return std::move(item.batch);
  }
  // End of pass or error: the producer has returned (or is returning).
  phase_ = Phase::kFinished;
  if (thread_.joinable()) thread_.join();
  if (item.error) std::rethrow_exception(item.error);
  return std::nullopt;
}

void DeviceLoader::close() {
  stop();
  phase_ = Phase::kClosed;
}

void DeviceLoader::set_epoch(uint64_t epoch) {
  stop();
  loader_->set_epoch(epoch);
  epoch_ = epoch;
  epoch_chosen_ = true;
  phase_ = Phase::kIdle;
  have_pass_ = false;
}

LoaderState DeviceLoader::state() const {
  STRATA_CHECK(resumable(), ConfigError,
               "[data] the loader wrapped by this DeviceLoader cannot save its position");
  if (have_pass_ && advance_epoch_ && phase_ == Phase::kFinished) return {pass_start_.epoch + 1, 0};
  if (have_pass_) return {pass_start_.epoch, pass_start_.position + consumed_};
  return loader_->state();
}

void DeviceLoader::load_state(const LoaderState& state) {
  stop();
  loader_->load_state(state);
  epoch_ = state.epoch;
  epoch_chosen_ = true;
  phase_ = Phase::kIdle;
  have_pass_ = false;
}

}  // namespace strata::data
