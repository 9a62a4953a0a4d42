// comm::Group: the collectives handle over a Backend.
//
// Every operation, synchronous or not, becomes a Task on the group's queue
// and runs on the group's one worker thread, in call order (Note [One
// worker thread per group]). Group adds what backends do not have to:
// layouts (non-contiguous tensors go through a contiguous buffer), mean
// reductions, output shapes, variable-size byte transfers, statistics and
// the cross-rank debug checks (Note [Debug descriptors]).
#include "strata/comm/group.h"

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "strata/comm/local.h"
#include "strata/core/error.h"
#include "strata/runtime/progress.h"

namespace strata::comm {
namespace {

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

enum class OpKind : int64_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown";
}

std::string dtype_name(int64_t scalar_type) {
  switch (static_cast<at::ScalarType>(scalar_type)) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    default: return c10::toString(static_cast<at::ScalarType>(scalar_type));
  }
}

void check_dtype(OpKind op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kBFloat16:
    case at::kHalf: case at::kInt: case at::kLong:
      return;
    default:
      throw ConfigError(detail::cat("[comm] ", op_name(op), ": dtype ", t.scalar_type(),
                                    " is not supported; use float32, float64, bfloat16, float16, "
                                    "int32 or int64"));
  }
}

// Note [Debug descriptors]
// In debug mode every collective is preceded by an all-gather of a
// fixed-size int64 descriptor of the call (operation, reduce op, dtype,
// shape, call number, broadcast source, barrier name). All ranks then hold
// every rank's descriptor, compare them identically and throw the same
// CommError when they differ, instead of hanging in, or silently mixing,
// mismatched calls. The exchange itself cannot mismatch: it always has the
// same size and dtype.
constexpr int kMaxDims = 8;
constexpr int kNameWords = 2;  // barrier names: first 16 bytes
struct Descriptor {
  int64_t op = 0, reduce_op = -1, dtype = -1, ndim = 0, numel = 0, seq = 0, src = -1;
  int64_t dims[kMaxDims] = {};
  int64_t name[kNameWords] = {};
};
constexpr int kDescriptorWords = sizeof(Descriptor) / sizeof(int64_t);

Descriptor describe(OpKind op, int64_t seq, const at::Tensor* t, int64_t reduce_op, int64_t src,
                    const std::string& name) {
  Descriptor d;
  d.op = static_cast<int64_t>(op);
  d.seq = seq;
  d.reduce_op = reduce_op;
  d.src = src;
  if (t != nullptr) {
    d.dtype = static_cast<int64_t>(t->scalar_type());
    d.ndim = t->dim();
    d.numel = t->numel();
    for (int i = 0; i < std::min<int64_t>(d.ndim, kMaxDims); ++i) d.dims[i] = t->size(i);
  }
  std::memcpy(d.name, name.data(), std::min(name.size(), sizeof(d.name)));
  return d;
}

std::string shape_string(const Descriptor& d) {
  std::string s = "[";
  for (int64_t i = 0; i < d.ndim; ++i) {
    if (i > 0) s += ", ";
    s += i < kMaxDims ? std::to_string(d.dims[i]) : std::string("...");
    if (i >= kMaxDims) break;
  }
  return s + "]";
}

std::string name_string(const Descriptor& d) {
  const char* p = reinterpret_cast<const char*>(d.name);
  return "'" + std::string(p, strnlen(p, sizeof(d.name))) + "'";
}

/// "rank 0 [4, 3], ranks 1, 2 [4, 2]": ranks grouped by the value `show`
/// gives, in order of first appearance; "" when all values are equal.
template <class Show>
std::string differences(const std::vector<Descriptor>& all, Show show) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    std::string v = show(all[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {r}});
    else it->second.push_back(r);
  }
  if (groups.size() <= 1) return "";
  std::string out;
  for (const auto& [value, ranks] : groups) {
    if (!out.empty()) out += ", ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += " " + value;
  }
  return out;
}

/// The mismatch message for `all` (every rank's descriptor), "" when they
/// agree. Identical on every rank.
std::string compare_descriptors(const std::vector<Descriptor>& all) {
  std::vector<std::string> problems;
  auto add = [&](const char* what, const std::string& diff) {
    if (!diff.empty()) problems.push_back(std::string(what) + " differ across ranks: " + diff);
  };
  add("operations", differences(all, [](const Descriptor& d) { return std::string(op_name(OpKind(d.op))); }));
  add("call numbers", differences(all, [](const Descriptor& d) { return "#" + std::to_string(d.seq); }));
  if (!problems.empty()) return problems.front() + (problems.size() > 1 ? "; " + problems[1] : "");
  add("reduce ops", differences(all, [](const Descriptor& d) {
        return d.reduce_op < 0 ? std::string("-") : to_string(ReduceOp(d.reduce_op)); }));
  add("dtypes", differences(all, [](const Descriptor& d) { return d.dtype < 0 ? std::string("-") : dtype_name(d.dtype); }));
  add("shapes", differences(all, shape_string));
  if (problems.empty() || problems.back().rfind("shapes", 0) != 0) {
    add("element counts", differences(all, [](const Descriptor& d) { return std::to_string(d.numel); }));
  }
  add("broadcast sources", differences(all, [](const Descriptor& d) { return "src " + std::to_string(d.src); }));
  add("barrier names", differences(all, name_string));
  std::string out;
  for (const std::string& p : problems) out += (out.empty() ? "" : "; ") + p;
  return out;
}

/// Thrown by the debug check; unlike a backend failure it leaves the group
/// usable (every rank saw the same descriptors and threw together).
class MismatchError final : public CommError {
 public:
  using CommError::CommError;
};

/// A queued operation and the Work handle returned for it.
class Task final : public Work {
 public:
  OpKind op;
  int64_t seq = 0;
  int64_t bytes = 0;
  bool debug = false;
  Descriptor descriptor;
  std::string label;               // "all_reduce #3", "barrier 'name' #4"
  std::function<void()> run;

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) {
      observed_ = true;
      std::rethrow_exception(error_);
    }
  }

  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

  /// Waits; returns the error not yet rethrown by wait() (and marks it seen).
  std::exception_ptr wait_unobserved() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_ || observed_) return nullptr;
    observed_ = true;
    return error_;
  }

  bool settled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ && (!error_ || observed_);
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool observed_ = false;
  std::exception_ptr error_;
};

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

std::string human_bytes(int64_t b) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (b >= (int64_t(1) << 30)) out << b / double(int64_t(1) << 30) << " GB";
  else if (b >= (1 << 20)) out << b / double(1 << 20) << " MB";
  else if (b >= (1 << 10)) out << b / double(1 << 10) << " KB";
  else out << b << " B";
  return out.str();
}

/// Divides a sum by `n` in place (integers: floor division).
void divide(at::Tensor& t, int n) {
  if (n == 1) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) t.div_(n, "floor");
  else t.div_(n);
}

}  // namespace

struct Group::State {
  std::shared_ptr<Backend> backend;
  GroupOptions options;
  std::atomic<bool> debug{false};

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

  /// Queues `task` (taking the next call number) and returns it; with
  /// `sync`, runs it on this thread when nothing is queued or running
  /// (Note [Synchronous fast path]) and returns it finished.
  std::shared_ptr<Task> submit(std::shared_ptr<Task> task, const at::Tensor* t, int64_t reduce_op,
                               int64_t src, const std::string& name, bool sync = false) {
    std::unique_lock<std::mutex> lock(mu);
    task->seq = next_seq++;
    task->debug = debug.load();
    task->descriptor = describe(task->op, task->seq, t, reduce_op, src, name);
    task->label = std::string(op_name(task->op)) + (name.empty() ? "" : " '" + name + "'") + " #" +
                  std::to_string(task->seq);
    if (sync && queue.empty() && !busy) {
      busy = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        error = execute(*task);
      } catch (...) {
        error = std::current_exception();
      }
      task->finish(error);
      lock.lock();
      busy = false;
      if (!queue.empty()) cv.notify_all();
      return task;
    }
    if (!worker.joinable()) worker = std::thread([this] { loop(); });
    unsynced.erase(std::remove_if(unsynced.begin(), unsynced.end(),
                                  [](const std::shared_ptr<Task>& w) { return w->settled(); }),
                   unsynced.end());
    if (!sync) unsynced.push_back(task);
    queue.push_back(task);
    cv.notify_all();
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
      task->finish(execute(*task));
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
      return std::make_exception_ptr(CommError(detail::cat(
          "[comm] ", task.label, " not run: an earlier collective of this group failed (",
          failed_before, "); create a new group after a communication failure")));
    }
    auto start = std::chrono::steady_clock::now();
    try {
      runtime::CollectiveScope in_collective(task.label);  // for the launcher's stuck-rank report
      if (task.debug) check_descriptors(task);
      task.run();
    } catch (const ConfigError&) {
      return std::current_exception();  // argument errors leave the group usable
    } catch (const MismatchError&) {
      return std::current_exception();
    } catch (const c10::Error& e) {  // a copy after the collective: the group is intact
      return std::make_exception_ptr(CommError(detail::cat("[comm] ", task.label, " failed: ", e.what_without_backtrace())));
    } catch (const TimeoutError& e) {
      return fail(task, std::make_exception_ptr(TimeoutError(detail::cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const CommError& e) {
      return fail(task, std::make_exception_ptr(CommError(detail::cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const std::exception& e) {
      return fail(task, std::make_exception_ptr(CommError(detail::cat("[comm] ", task.label, " failed: ", e.what()))), e.what());
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(stats_mu);
    CommStats::Entry& e = entry_for(stats, task.op);
    e.calls += 1;
    e.bytes += task.bytes;
    e.seconds += seconds;
    return nullptr;
  }

  std::exception_ptr fail(const Task& task, std::exception_ptr error, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.empty()) broken = task.label + ": " + why;
    return error;
  }

  /// Note [Debug descriptors]. Throws CommError ("[comm] ...") on mismatch.
  void check_descriptors(const Task& task) {
    const int n = backend->size();
    at::Tensor mine = at::empty({kDescriptorWords}, at::kLong);
    std::memcpy(mine.data_ptr(), &task.descriptor, sizeof(Descriptor));
    at::Tensor all = at::empty({n * kDescriptorWords}, at::kLong);
    backend->all_gather(mine, all);
    std::vector<Descriptor> descriptors(n);
    std::memcpy(descriptors.data(), all.data_ptr(), n * sizeof(Descriptor));
    std::string problem = compare_descriptors(descriptors);
    if (!problem.empty()) throw MismatchError(detail::cat("[comm] ", task.label, ": ", problem));
  }
};

// ---- Work-producing operations ----------------------------------------------

namespace {
std::shared_ptr<Task> make_task(OpKind op, int64_t bytes, std::function<void()> run) {
  auto task = std::make_shared<Task>();
  task->op = op;
  task->bytes = bytes;
  task->run = std::move(run);
  return task;
}
}  // namespace

Group::Group() : Group(local::create()) {}

Group::Group(std::shared_ptr<Backend> backend, GroupOptions options) : state_(std::make_shared<State>()) {
  STRATA_CHECK(backend != nullptr, ConfigError, "[comm] Group needs a backend, got nullptr");
  state_->backend = std::move(backend);
  state_->options = options;
  state_->debug = options.debug;
}

int Group::rank() const { return state_->backend->rank(); }
int Group::size() const { return state_->backend->size(); }
std::string Group::backend_name() const { return state_->backend->name(); }
bool Group::debug() const { return state_->debug.load(); }
void Group::set_debug(bool debug) { state_->debug = debug; }

void Group::all_reduce(at::Tensor& tensor, ReduceOp op) { start_all_reduce(tensor, op, true)->wait(); }

WorkPtr Group::all_reduce_async(at::Tensor tensor, ReduceOp op) { return start_all_reduce(std::move(tensor), op, false); }

WorkPtr Group::start_all_reduce(at::Tensor tensor, ReduceOp op, bool sync) {
  check_dtype(OpKind::kAllReduce, tensor);
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kAllReduce, tensor.nbytes(), [backend, tensor, op]() mutable {
    at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
    backend->all_reduce(buffer, op == ReduceOp::kMean ? ReduceOp::kSum : op);
    if (op == ReduceOp::kMean) divide(buffer, backend->size());
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
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
  auto task = make_task(OpKind::kReduceScatter, input.nbytes(), [backend, input, output, op]() mutable {
    at::Tensor result = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
    backend->reduce_scatter(input.contiguous(), result, op == ReduceOp::kMean ? ReduceOp::kSum : op);
    if (op == ReduceOp::kMean) divide(result, backend->size());
    if (!result.is_same(output)) output.copy_(result);
  });
  return state_->submit(task, &input, static_cast<int64_t>(op), -1, "", sync);
}

void Group::broadcast(at::Tensor& tensor, int src) { start_broadcast(tensor, src, true)->wait(); }

WorkPtr Group::broadcast_async(at::Tensor tensor, int src) { return start_broadcast(std::move(tensor), src, false); }

WorkPtr Group::start_broadcast(at::Tensor tensor, int src, bool sync) {
  STRATA_CHECK(src >= 0 && src < size(), ConfigError, "[comm] broadcast: source rank ", src,
               " is outside the group (size ", size(), ")");
  if (tensor.scalar_type() != at::kByte) check_dtype(OpKind::kBroadcast, tensor);  // bytes: internal
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kBroadcast, tensor.nbytes(), [backend, tensor, src]() mutable {
    at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
    backend->broadcast(buffer, src);
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  });
  return state_->submit(task, &tensor, -1, src, "", sync);
}

// Variable-size transfers: the sizes first (fixed shape on every rank), then
// a payload every rank can allocate identically.
std::string Group::broadcast_bytes(const std::string& bytes, int src) {
  at::Tensor length = at::full({1}, rank() == src ? static_cast<int64_t>(bytes.size()) : 0, at::kLong);
  broadcast(length, src);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return "";
  at::Tensor payload = at::empty({n}, at::kByte);
  if (rank() == src) std::memcpy(payload.data_ptr(), bytes.data(), n);
  broadcast(payload, src);
  return std::string(static_cast<const char*>(payload.data_ptr()), n);
}

std::vector<std::string> Group::all_gather_bytes(const std::string& bytes) {
  at::Tensor lengths = all_gather(at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong));
  std::vector<int64_t> sizes(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + size());
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::string> out(size());
  if (longest == 0) return out;
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  at::Tensor all = at::empty({size() * longest}, at::kByte);
  std::shared_ptr<Backend> backend = state_->backend;
  auto task = make_task(OpKind::kAllGather, longest, [backend, mine, all]() mutable { backend->all_gather(mine, all); });
  state_->submit(task, &mine, -1, -1, "", true)->wait();
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

// ---- statistics -------------------------------------------------------------

CommStats::Entry CommStats::total() const {
  Entry t;
  for (const Entry* e : {&all_reduce, &all_gather, &reduce_scatter, &broadcast, &barrier}) {
    t.calls += e->calls;
    t.bytes += e->bytes;
    t.seconds += e->seconds;
  }
  return t;
}

std::string CommStats::summary() const {
  std::ostringstream out;
  const std::pair<const char*, const Entry*> entries[] = {{"all_reduce", &all_reduce},
                                                          {"all_gather", &all_gather},
                                                          {"reduce_scatter", &reduce_scatter},
                                                          {"broadcast", &broadcast},
                                                          {"barrier", &barrier}};
  for (const auto& [name, e] : entries) {
    if (e->calls == 0) continue;
    if (out.tellp() > 0) out << " | ";
    out << name << " " << e->calls << "x " << human_bytes(e->bytes) << " " << std::fixed
        << std::setprecision(1) << e->seconds * 1e3 << " ms";
  }
  return out.tellp() > 0 ? out.str() : "no collectives";
}

}  // namespace strata::comm
