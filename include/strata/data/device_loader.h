// The device loader (torch_xla's MpDeviceLoader role): a background thread
// pulls batches from another loader into a bounded queue, so data loading
// overlaps the training step, and they reach the training device without
// stalling it (Note [One batch ahead]).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "strata/data/loader.h"

namespace strata::data {

/// Wraps a Loader; yields exactly its batches, in order, on `device`.
///
/// Note [One batch ahead]
/// To the CPU a batch is handed over as the wrapped loader made it. To an
/// accelerator (a GPU) the producer thread copies each CPU batch into
/// pinned (page-locked) host memory, and the consumer copies it to the
/// device with non_blocking on a copy stream of its own, one batch ahead:
/// next() returns batch i (copied during the previous step) and starts the
/// copy of batch i+1, which then overlaps step i. Before returning a batch,
/// next() makes the calling thread's current stream on `device` (the
/// stream the training step computes on) wait for that batch's copy
/// through an event, and records the batch's memory as used by that
/// stream, so the caching allocator does not reuse it while the step still
/// reads it. No host synchronisation happens. A consumer that moves the
/// batch to yet another stream orders that stream itself (for example by
/// making it wait on the current one). At most two batches live on the
/// device: the one handed out and the one in flight; the queue of
/// queue_depth batches is pinned host memory. These device-generic streams
/// and events (c10::Stream, c10::Event) need no CUDA header, so the same
/// code serves any device LibTorch has a stream implementation for.
///
/// Each pass (reset(), or a new range-for) stops the previous producer
/// thread, resets the wrapped loader and starts a new thread that fills a
/// queue of at most queue_depth batches. next() blocks until a batch, the
/// end of the pass, or the producer's error arrives; an exception thrown
/// by the wrapped loader is rethrown in the consumer as the same object
/// (same type and message), after which the pass is over. size() is the
/// wrapped loader's. close() and the destructor stop the thread without
/// hanging, also when the consumer stopped early and the producer waits on
/// a full queue (a producer blocked inside the wrapped loader's next() is
/// waited for).
class DeviceLoader : public Loader {
 public:
  /// Throws ConfigError when `loader` is null or queue_depth is 0.
  DeviceLoader(std::shared_ptr<Loader> loader, at::Device device, size_t queue_depth = 16);
  ~DeviceLoader() override;
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  size_t size() const override { return loader_->size(); }
  /// The next batch (on the device). Starts a pass if none is running;
  /// returns std::nullopt at the end of the pass and after close().
  std::optional<Batch> next() override;
  /// Stops the running pass and starts a new one.
  void reset() override;
  /// Stops the producer thread and drops the queued batches. A later
  /// reset() (or range-for) starts again.
  void close();

  /// Stops the running pass, then forwards to the wrapped loader. The next
  /// pass uses this epoch, also when passes advance the epoch by themselves.
  void set_epoch(uint64_t epoch) override;
  /// With `on`, every pass after the first starts the next epoch (the
  /// wrapped loader's set_epoch(epoch + 1) before its reset), as Lightning
  /// Fabric's loaders do; an explicit set_epoch() or load_state() since the
  /// last pass takes precedence. process_dataloader turns it on. Off by
  /// default.
  void advance_epoch_each_pass(bool on) { advance_epoch_ = on; }
  /// Calls `mark` at the start of every next(), before a batch is taken:
  /// on a lazy device (xla) taking the next batch ends the step that used
  /// the last one, as torch_xla's MpDeviceLoader does, so `mark` runs that
  /// step (a no-op when the loop marked it already). process_dataloader
  /// sets it to the accelerator's end_step (a no-op on an eager device).
  /// Empty (the default): nothing is called.
  void mark_steps_with(std::function<void()> mark) { mark_step_ = std::move(mark); }
  bool resumable() const override { return loader_->resumable(); }
  /// The wrapped loader's state as the consumer sees it: batches still in
  /// the queue (prefetched, not yet returned) do not count as consumed.
  /// When passes advance the epoch and the last pass ran to its end, the
  /// next pass's start: {epoch + 1, 0}.
  LoaderState state() const override;
  /// Stops the running pass, then forwards to the wrapped loader; the next
  /// pass continues at `state`.
  void load_state(const LoaderState& state) override;
  bool is_device_loader() const override { return true; }

  /// The wrapped loader.
  const std::shared_ptr<Loader>& loader() const { return loader_; }
  at::Device device() const { return device_; }
  size_t queue_depth() const { return queue_depth_; }

 private:
  struct Item {
    std::optional<Batch> batch;  // empty: end of pass (or error)
    std::exception_ptr error;
    std::shared_ptr<c10::Event> copied;  // recorded after the copy to the device
  };
  void produce();
  void stop();
  Batch to_device(const Batch& batch) const;
  // Note [One batch ahead]: on CUDA the producer pins, the consumer copies
  // on its stream; on other devices (xla) the producer uploads the batch.
  bool staged() const { return device_.is_cuda(); }
  Batch pin(const Batch& batch) const;
  std::optional<Item> pop(bool wait);
  Item start_copy(Item item);
  void order_after_copy(const Item& item) const;

  std::shared_ptr<Loader> loader_;
  at::Device device_;
  size_t queue_depth_;

  std::mutex mutex_;
  std::condition_variable not_full_;   // producer waits for room
  std::condition_variable not_empty_;  // consumer waits for an item
  std::deque<Item> queue_;
  bool stop_requested_ = false;

  std::thread thread_;
  std::optional<c10::Stream> copy_stream_;  // made at the first copy to the device
  std::optional<Item> ahead_;               // the batch whose copy is in flight
  // Consumer-side state: kIdle until the first next()/reset() (or after
  // set_epoch/load_state), kRunning during a pass, kFinished after its end
  // (or its error), kClosed after close().
  enum class Phase { kIdle, kRunning, kFinished, kClosed };
  Phase phase_ = Phase::kIdle;
  bool have_pass_ = false;  // pass_start_/consumed_ describe a pass
  bool advance_epoch_ = false;  // advance_epoch_each_pass
  std::function<void()> mark_step_;  // mark_steps_with
  bool epoch_chosen_ = false;   // set_epoch/load_state since the last pass
  uint64_t passes_ = 0;         // passes started
  uint64_t epoch_ = 0;          // the epoch of the last pass (or the chosen one)
  LoaderState pass_start_;
  uint64_t consumed_ = 0;
};

}  // namespace strata::data
