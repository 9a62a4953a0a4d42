// comm::Group: the collectives handle over a Backend.
//
// Every operation, synchronous or not, becomes a Task (task.h). Over a host
// backend it runs on the group's one worker thread, in call order (Note
// [One worker thread per group]); over a stream-ordered backend the caller
// enqueues it on its own thread (Note [Stream-ordered backends] in
// backend.h). Group adds what backends do not have to: layouts
// (non-contiguous tensors go through a contiguous buffer), mean reductions,
// output shapes, variable-size byte transfers, statistics and the
// cross-rank debug checks (Note [Debug descriptors], debug.cpp).
#include "strata/comm/group.h"

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "debug.h"
#include "strata/comm/local.h"
#include "strata/core/error.h"
#include "strata/runtime/progress.h"
#include "task.h"

namespace strata::comm {
namespace {

using detail::OpKind;
using detail::Task;
using strata::detail::cat;

// Note [One worker thread per group]
// Collectives must be issued in the same order on every rank. Async calls
// go through one queue to the group's worker thread, in call order. A
// synchronous call that finds the queue empty and the worker idle runs on
// the caller's thread instead (Note [Synchronous fast path]); otherwise it
// queues behind the async calls and waits, so no call ever overtakes an
// earlier one. Either way one thread at a time is inside the backend
// (`busy`), so backends need no locking.
//
// Note [Synchronous fast path]
// Handing a small synchronous collective to the worker and waiting for it
// costs two thread wake-ups (tens of microseconds on a loaded machine, as
// much as a 64 KB shared-memory all-reduce itself). Running it in place
// costs a mutex and a flag.
//
// Note [Enqueueing in call order]
// A stream-ordered backend has no worker thread: every call enqueues on
// the caller's thread under `enqueue_mu`, which also takes the call number,
// so calls from several threads (autograd's device threads among them)
// reach the backend one at a time and in the order of their numbers.

void check_dtype(OpKind op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kBFloat16:
    case at::kHalf: case at::kInt: case at::kLong:
      return;
    default:
      throw ConfigError(cat("[comm] ", detail::op_name(op), ": dtype ", t.scalar_type(),
                            " is not supported; use float32, float64, bfloat16, float16, int32 or int64"));
  }
}

CommStats::Entry& entry_for(CommStats& s, OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return s.all_reduce;
    case OpKind::kAllGather: return s.all_gather;
    case OpKind::kReduceScatter: return s.reduce_scatter;
    case OpKind::kBroadcast: return s.broadcast;
    case OpKind::kBarrier: return s.barrier;
  }
  return s.barrier;
}

/// Divides a sum by `n` in place (integers: floor division).
void divide(at::Tensor& t, int n) {
  if (n == 1) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) t.div_(n, "floor");
  else t.div_(n);
}

}  // namespace

struct Group::State : std::enable_shared_from_this<Group::State> {
  std::shared_ptr<Backend> backend;
  GroupOptions options;
  std::atomic<bool> debug{false};
  bool stream_ordered = false;
  std::mutex enqueue_mu;  // Note [Enqueueing in call order]; taken before mu

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<std::shared_ptr<Task>> queue;
  std::vector<std::shared_ptr<Task>> unsynced;  // for synchronize()
  std::thread worker;
  bool stopping = false;
  bool busy = false;  // a thread (the worker or a synchronous caller) is in the backend
  int64_t next_seq = 1;
  std::string broken;  // first backend failure: later calls fail fast

  mutable std::mutex stats_mu;
  CommStats stats;

  ~State() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  /// Numbers `task` and describes it (under mu).
  void label(Task& task, const at::Tensor* t, int64_t reduce_op, int64_t src, const std::string& name) {
    task.seq = next_seq++;
    task.debug = debug.load();
    task.descriptor = detail::describe(task.op, task.seq, t, reduce_op, src, name);
    task.label = std::string(detail::op_name(task.op)) + (name.empty() ? "" : " '" + name + "'") + " #" +
                 std::to_string(task.seq);
  }

  void track(const std::shared_ptr<Task>& task, bool sync) {
    unsynced.erase(std::remove_if(unsynced.begin(), unsynced.end(),
                                  [](const std::shared_ptr<Task>& w) { return w->settled(); }),
                   unsynced.end());
    if (!sync) unsynced.push_back(task);
  }

  /// Queues `task` (taking the next call number) and returns it; with
  /// `sync`, runs it on this thread when nothing is queued or running
  /// (Note [Synchronous fast path]) and returns it finished. Over a
  /// stream-ordered backend, enqueues it on this thread (Note [Enqueueing
  /// in call order]).
  std::shared_ptr<Task> submit(std::shared_ptr<Task> task, const at::Tensor* t, int64_t reduce_op,
                               int64_t src, const std::string& name, bool sync = false) {
    if (stream_ordered) return enqueue(std::move(task), t, reduce_op, src, name, sync);
    std::unique_lock<std::mutex> lock(mu);
    label(*task, t, reduce_op, src, name);
    if (sync && queue.empty() && !busy) {
      busy = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        error = execute(*task);
      } catch (...) {
        error = std::current_exception();
      }
      task->release_closures();
      task->finish(error);
      lock.lock();
      busy = false;
      if (!queue.empty()) cv.notify_all();
      return task;
    }
    if (!worker.joinable()) worker = std::thread([this] { loop(); });
    track(task, sync);
    queue.push_back(task);
    cv.notify_all();
    return task;
  }

  /// Note [Stream-ordered tasks] (task.h), Note [Enqueueing in call order].
  std::shared_ptr<Task> enqueue(std::shared_ptr<Task> task, const at::Tensor* t, int64_t reduce_op, int64_t src,
                                const std::string& name, bool sync) {
    std::lock_guard<std::mutex> order(enqueue_mu);
    {
      std::lock_guard<std::mutex> lock(mu);
      label(*task, t, reduce_op, src, name);
      track(task, sync);
    }
    std::weak_ptr<State> weak = weak_from_this();
    Task* raw = task.get();
    task->on_device_error = [weak, raw](std::exception_ptr error) {
      std::shared_ptr<State> self = weak.lock();
      return self ? self->classify(*raw, error) : error;
    };
    std::exception_ptr error;
    try {
      error = execute(*task);
    } catch (...) {
      error = std::current_exception();
    }
    task->run = nullptr;  // enqueued; `then` waits for the first wait()
    // A barrier blocked until it was over; a failed call never reached the
    // device: both are finished now.
    if (error || !task->device) {
      task->release_closures();
      task->finish(error);
    }
    return task;
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !busy && (stopping || !queue.empty()); });
        if (queue.empty()) return;
        task = queue.front();
        queue.pop_front();
        busy = true;
      }
      std::exception_ptr error = execute(*task);
      task->release_closures();
      task->finish(error);
      std::lock_guard<std::mutex> lock(mu);
      busy = false;
    }
  }

  std::exception_ptr execute(Task& task) {
    std::string failed_before;
    {
      std::lock_guard<std::mutex> lock(mu);
      failed_before = broken;
    }
    if (!failed_before.empty()) {
      return std::make_exception_ptr(CommError(cat(
          "[comm] ", task.label, " not run: an earlier collective of this group failed (",
          failed_before, "); create a new group after a communication failure")));
    }
    auto start = std::chrono::steady_clock::now();
    try {
      runtime::CollectiveScope in_collective(task.label);  // for the launcher's stuck-rank report
      if (task.debug) detail::check_descriptors(*backend, task.descriptor, task.label);
      task.run();
      if (!stream_ordered) {
        if (task.then) task.then();
      } else if (task.op != OpKind::kBarrier) {
        task.device = backend->take_work();
        STRATA_ASSERT(task.device != nullptr, "[comm] the stream-ordered backend ", backend->name(),
                      " returned no work for ", task.label);
      }
    } catch (...) {
      return classify(task, std::current_exception());
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(stats_mu);
    CommStats::Entry& e = entry_for(stats, task.op);
    e.calls += 1;
    e.bytes += task.bytes;
    e.seconds += seconds;
    return nullptr;
  }

  /// The error `task` reports for `error`: argument errors and debug
  /// mismatches as they are (the group stays usable), a failed copy after
  /// the collective as a CommError, anything else named after the call and
  /// recorded so that later calls fail fast.
  std::exception_ptr classify(const Task& task, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const ConfigError&) {
      return error;
    } catch (const detail::MismatchError&) {
      return error;
    } catch (const c10::Error& e) {  // a copy after the collective: the group is intact
      return std::make_exception_ptr(CommError(cat("[comm] ", task.label, " failed: ", e.what_without_backtrace())));
    } catch (const TimeoutError& e) {
      return fail(task, std::make_exception_ptr(TimeoutError(cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const CommError& e) {
      return fail(task, std::make_exception_ptr(CommError(cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const std::exception& e) {
      return fail(task, std::make_exception_ptr(CommError(cat("[comm] ", task.label, " failed: ", e.what()))), e.what());
    }
  }

  std::exception_ptr fail(const Task& task, std::exception_ptr error, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.empty()) broken = task.label + ": " + why;
    return error;
  }
};

// ---- Work-producing operations ----------------------------------------------

namespace {
std::shared_ptr<Task> make_task(OpKind op, int64_t bytes, std::function<void()> run,
                                std::function<void()> then = {}) {
  auto task = std::make_shared<Task>();
  task->op = op;
  task->bytes = bytes;
  task->run = std::move(run);
  task->then = std::move(then);
  return task;
}
}  // namespace

Group::Group() : Group(local::create()) {}

Group::Group(std::shared_ptr<Backend> backend, GroupOptions options) : state_(std::make_shared<State>()) {
  STRATA_CHECK(backend != nullptr, ConfigError, "[comm] Group needs a backend, got nullptr");
  state_->backend = std::move(backend);
  state_->options = options;
  state_->debug = options.debug;
  state_->stream_ordered = state_->backend->stream_ordered();
}

int Group::rank() const { return state_->backend->rank(); }
int Group::size() const { return state_->backend->size(); }
std::string Group::backend_name() const { return state_->backend->name(); }
c10::Device Group::device() const { return state_->backend->device(); }
bool Group::debug() const { return state_->debug.load(); }
void Group::set_debug(bool debug) { state_->debug = debug; }

void Group::all_reduce(at::Tensor& tensor, ReduceOp op) { start_all_reduce(tensor, op, true)->wait(); }

WorkPtr Group::all_reduce_async(at::Tensor tensor, ReduceOp op) { return start_all_reduce(std::move(tensor), op, false); }

// The contiguous buffer is made when the task runs (on the worker thread
// for async calls), and shared with what follows the collective.
WorkPtr Group::start_all_reduce(at::Tensor tensor, ReduceOp op, bool sync) {
  check_dtype(OpKind::kAllReduce, tensor);
  std::shared_ptr<Backend> backend = state_->backend;
  auto buffer = std::make_shared<at::Tensor>();
  auto task = make_task(
      OpKind::kAllReduce, tensor.nbytes(),
      [backend, tensor, op, buffer] {
        *buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
        backend->all_reduce(*buffer, op == ReduceOp::kMean ? ReduceOp::kSum : op);
      },
      [backend, tensor, op, buffer]() mutable {
        if (op == ReduceOp::kMean) divide(*buffer, backend->size());
        if (!buffer->is_same(tensor)) tensor.copy_(*buffer);
      });
  return state_->submit(task, &tensor, static_cast<int64_t>(op), -1, "", sync);
}

at::Tensor Group::all_gather(const at::Tensor& tensor) {
  std::vector<int64_t> shape{size()};
  for (int64_t s : tensor.sizes()) shape.push_back(s);
  at::Tensor output = at::empty(shape, tensor.options().memory_format(at::MemoryFormat::Contiguous));
  start_all_gather(tensor, output, true)->wait();
  return output;
}

void Group::all_gather(const at::Tensor& input, const at::Tensor& output) { start_all_gather(input, output, true)->wait(); }

WorkPtr Group::all_gather_async(at::Tensor input, at::Tensor output) {
  return start_all_gather(std::move(input), std::move(output), false);
}

WorkPtr Group::start_all_gather(at::Tensor input, at::Tensor output, bool sync) {
  check_dtype(OpKind::kAllGather, input);
  STRATA_CHECK(output.scalar_type() == input.scalar_type(), ConfigError,
               "[comm] all_gather: output dtype ", output.scalar_type(), " differs from input dtype ",
               input.scalar_type());
  STRATA_CHECK(output.is_contiguous() && output.numel() == size() * input.numel(), ConfigError,
               "[comm] all_gather: output must be contiguous with ", size() * input.numel(),
               " elements (size() * input.numel()), got ", output.numel(),
               output.is_contiguous() ? "" : " (non-contiguous)");
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kAllGather, input.nbytes(), [backend, input, output]() mutable {
    backend->all_gather(input.contiguous(), output);
  });
  return state_->submit(task, &input, -1, -1, "", sync);
}

at::Tensor Group::reduce_scatter(const at::Tensor& input, ReduceOp op) {
  STRATA_CHECK(input.dim() >= 1 && input.size(0) % size() == 0, ConfigError,
               "[comm] reduce_scatter: the first dimension of the input (shape ", input.sizes(),
               ") must be divisible by the group size ", size());
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape[0] /= size();
  at::Tensor output = at::empty(shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  start_reduce_scatter(input, output, op, true)->wait();
  return output;
}

void Group::reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op) {
  start_reduce_scatter(input, output, op, true)->wait();
}

WorkPtr Group::reduce_scatter_async(at::Tensor input, at::Tensor output, ReduceOp op) {
  return start_reduce_scatter(std::move(input), std::move(output), op, false);
}

WorkPtr Group::start_reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op, bool sync) {
  check_dtype(OpKind::kReduceScatter, input);
  STRATA_CHECK(output.scalar_type() == input.scalar_type(), ConfigError,
               "[comm] reduce_scatter: output dtype ", output.scalar_type(), " differs from input dtype ",
               input.scalar_type());
  STRATA_CHECK(input.numel() == size() * output.numel(), ConfigError, "[comm] reduce_scatter: input has ",
               input.numel(), " elements, expected size() * output.numel() = ", size() * output.numel());
  std::shared_ptr<Backend> backend = state_->backend;
  auto result = std::make_shared<at::Tensor>();
  auto task = make_task(
      OpKind::kReduceScatter, input.nbytes(),
      [backend, input, output, op, result] {
        *result = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
        backend->reduce_scatter(input.contiguous(), *result, op == ReduceOp::kMean ? ReduceOp::kSum : op);
      },
      [backend, output, op, result]() mutable {
        if (op == ReduceOp::kMean) divide(*result, backend->size());
        if (!result->is_same(output)) output.copy_(*result);
      });
  return state_->submit(task, &input, static_cast<int64_t>(op), -1, "", sync);
}

namespace {

/// Checks a segmented call (Note [Segmented layouts]): a supported dtype,
/// the same on both sides, both contiguous, the full buffer (`full_name`:
/// "input" or "output") `world` times the shard's numel, and segments
/// that cut the shard.
void check_segmented(OpKind op, const char* name, const at::Tensor& full, const char* full_name,
                     const at::Tensor& shard, const std::vector<int64_t>& segments, int world) {
  check_dtype(op, shard);
  STRATA_CHECK(full.scalar_type() == shard.scalar_type(), ConfigError, "[comm] ", name, ": ", full_name, " dtype ",
               full.scalar_type(), " differs from the shard's ", shard.scalar_type());
  const char* shard_name = std::string(full_name) == "output" ? "input" : "output";
  STRATA_CHECK(full.is_contiguous() && shard.is_contiguous() && full.numel() == world * shard.numel(), ConfigError,
               "[comm] ", name, ": input and output must be contiguous and the ", full_name, " hold ",
               world * shard.numel(), " elements (size() * ", shard_name, ".numel()), got ", full.numel());
  int64_t sum = 0;
  for (int64_t s : segments) {
    STRATA_CHECK(s >= 0, ConfigError, "[comm] ", name, ": a segment length is ", s, "; lengths must be >= 0");
    sum += s;
  }
  STRATA_CHECK(sum == shard.numel(), ConfigError, "[comm] ", name, ": the segments sum to ", sum,
               " elements, but this rank's shard has ", shard.numel());
}

/// Copies between a full buffer in the segmented layout and the rank-major
/// one of all_gather and reduce_scatter ((world, n): rank r's shard in row r).
void copy_segments(const at::Tensor& segmented, const at::Tensor& rank_major, const std::vector<int64_t>& segments,
                   int world, bool to_segmented) {
  const int64_t n = rank_major.numel() / world;
  at::Tensor rows = rank_major.view({world, n});
  int64_t begin = 0;
  for (int64_t len : segments) {
    if (len > 0) {
      at::Tensor place = segmented.narrow(0, world * begin, world * len).view({world, len});
      at::Tensor piece = rows.narrow(1, begin, len);
      if (to_segmented) {
        place.copy_(piece);
      } else {
        piece.copy_(place);
      }
    }
    begin += len;
  }
}

}  // namespace

WorkPtr Group::all_gather_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments) {
  check_segmented(OpKind::kAllGather, "all_gather_segmented", output, "output", input, segments, size());
  std::shared_ptr<Backend> backend = state_->backend;
  std::shared_ptr<Task> task;
  if (backend->supports_segmented()) {
    task = make_task(OpKind::kAllGather, input.nbytes(), [backend, input, output, segments]() mutable {
      backend->all_gather_segmented(input, output, segments);
    });
  } else {
    auto gathered = std::make_shared<at::Tensor>();
    task = make_task(
        OpKind::kAllGather, input.nbytes(),
        [backend, input, output, gathered] {
          *gathered = at::empty({output.numel()}, output.options());
          backend->all_gather(input, *gathered);
        },
        [backend, output, gathered, segments] {
          copy_segments(output, *gathered, segments, backend->size(), /*to_segmented=*/true);
          gathered->reset();
        });
  }
  return state_->submit(task, &input, -1, -1, "", false);
}

WorkPtr Group::reduce_scatter_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments,
                                              ReduceOp op) {
  check_segmented(OpKind::kReduceScatter, "reduce_scatter_segmented", input, "input", output, segments, size());
  std::shared_ptr<Backend> backend = state_->backend;
  const ReduceOp backend_op = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  auto packed = std::make_shared<at::Tensor>();  // kept until the result is in (stream-ordered backends)
  auto task = make_task(
      OpKind::kReduceScatter, input.nbytes(),
      [backend, input, output, segments, backend_op, packed]() mutable {
        if (backend->supports_segmented()) {
          backend->reduce_scatter_segmented(input, output, segments, backend_op);
          return;
        }
        *packed = at::empty({input.numel()}, input.options());
        copy_segments(input, *packed, segments, backend->size(), /*to_segmented=*/false);
        backend->reduce_scatter(*packed, output, backend_op);
      },
      [backend, output, op, packed]() mutable {
        if (op == ReduceOp::kMean) divide(output, backend->size());
        packed->reset();
      });
  return state_->submit(task, &input, static_cast<int64_t>(op), -1, "", false);
}

void Group::broadcast(at::Tensor& tensor, int src) { start_broadcast(tensor, src, true)->wait(); }

WorkPtr Group::broadcast_async(at::Tensor tensor, int src) { return start_broadcast(std::move(tensor), src, false); }

WorkPtr Group::start_broadcast(at::Tensor tensor, int src, bool sync) {
  STRATA_CHECK(src >= 0 && src < size(), ConfigError, "[comm] broadcast: source rank ", src,
               " is outside the group (size ", size(), ")");
  if (tensor.scalar_type() != at::kByte) check_dtype(OpKind::kBroadcast, tensor);  // bytes: internal
  std::shared_ptr<Backend> backend = state_->backend;
  auto buffer = std::make_shared<at::Tensor>();
  auto task = make_task(
      OpKind::kBroadcast, tensor.nbytes(),
      [backend, tensor, src, buffer] {
        *buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
        backend->broadcast(*buffer, src);
      },
      [tensor, buffer]() mutable {
        if (!buffer->is_same(tensor)) tensor.copy_(*buffer);
      });
  return state_->submit(task, &tensor, -1, src, "", sync);
}

// Variable-size transfers: the sizes first (fixed shape on every rank), then
// a payload every rank can allocate identically, on the backend's device
// (for CPU backends .to() and .cpu() below return the tensor itself).
std::string Group::broadcast_bytes(const std::string& bytes, int src) {
  const c10::Device device = state_->backend->device();
  at::Tensor length = at::full({1}, rank() == src ? static_cast<int64_t>(bytes.size()) : 0,
                               at::TensorOptions(at::kLong).device(device));
  broadcast(length, src);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return "";
  at::Tensor payload = at::empty({n}, at::kByte);
  if (rank() == src) std::memcpy(payload.data_ptr(), bytes.data(), n);
  at::Tensor on_device = payload.to(device);
  broadcast(on_device, src);
  payload = on_device.cpu();
  return std::string(static_cast<const char*>(payload.data_ptr()), n);
}

std::vector<std::string> Group::all_gather_bytes(const std::string& bytes) {
  const c10::Device device = state_->backend->device();
  at::Tensor lengths =
      all_gather(at::full({1}, static_cast<int64_t>(bytes.size()), at::TensorOptions(at::kLong).device(device))).cpu();
  std::vector<int64_t> sizes(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + size());
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::string> out(size());
  if (longest == 0) return out;
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  mine = mine.to(device);
  at::Tensor all = at::empty({size() * longest}, at::TensorOptions(at::kByte).device(device));
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kAllGather, longest, [backend, mine, all]() mutable { backend->all_gather(mine, all); });
  state_->submit(task, &mine, -1, -1, "", true)->wait();
  all = all.cpu();
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < size(); ++r) out[r].assign(base + r * longest, sizes[r]);
  return out;
}

void Group::barrier(const std::string& name) {
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kBarrier, 0, [backend] { backend->barrier(); });
  state_->submit(task, nullptr, -1, -1, name, true)->wait();
}

CommStats Group::stats() const {
  std::lock_guard<std::mutex> lock(state_->stats_mu);
  return state_->stats;
}

void Group::reset_stats() {
  std::lock_guard<std::mutex> lock(state_->stats_mu);
  state_->stats = CommStats();
}

void Group::synchronize() {
  std::vector<std::shared_ptr<Task>> pending;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    pending.swap(state_->unsynced);
  }
  std::exception_ptr first;
  for (const auto& task : pending) {
    std::exception_ptr e = task->wait_unobserved();
    if (e && !first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace strata::comm
