// DeviceLoader: a producer thread that prefetches batches from a wrapped
// loader onto the training device through a bounded queue.
#include "strata/data/device_loader.h"

#include "strata/core/error.h"

namespace strata::data {

DeviceLoader::DeviceLoader(std::shared_ptr<Loader> loader, at::Device device, size_t queue_depth)
    : loader_(std::move(loader)), device_(device), queue_depth_(queue_depth) {
  STRATA_CHECK(loader_ != nullptr, ConfigError, "[data] DeviceLoader needs a loader to wrap, got null");
  STRATA_CHECK(queue_depth_ >= 1, ConfigError, "[data] DeviceLoader queue_depth must be >= 1, got ",
               queue_depth_);
}

DeviceLoader::~DeviceLoader() { stop(); }

// Note [Asynchronous copies]: to a CUDA device, batches are staged in
// pinned host memory and copied with non_blocking on the producer thread's
// current stream, which is the device's default stream unless the caller
// changed it on that thread; the training step's kernels on the default
// stream are therefore ordered after the copy. A consumer that computes on
// another stream must synchronise with the default stream first. Other
// targets (CPU) copy synchronously; a batch already on the device is
// passed through unchanged.
Batch DeviceLoader::to_device(const Batch& batch) const {
  if (device_.is_cuda() && batch.input.device().is_cpu() && batch.target.device().is_cpu()) {
    return {batch.input.pin_memory().to(device_, /*non_blocking=*/true),
            batch.target.pin_memory().to(device_, /*non_blocking=*/true)};
  }
  return batch.to(device_);
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
      if (batch) item.batch = to_device(*batch);
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
  if (phase_ == Phase::kIdle) reset();
  if (phase_ != Phase::kRunning) return std::nullopt;
  Item item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  not_full_.notify_one();
  if (item.batch) {
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
