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

#include <cstring>

#include "group_state.h"
#include "strata/comm/local.h"


namespace strata::comm {

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
