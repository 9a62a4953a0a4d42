// DDPStrategy: bucketed gradient all-reduce overlapped with backward.
//
// Note [Gradient buckets]
// Parameters are grouped, in reverse registration order (roughly the order
// backward produces their gradients), into buckets of at most
// bucket_cap_mb. A post hook on each parameter's gradient accumulator
// copies the accumulated gradient into its bucket's flat buffer; when a
// bucket is full and every earlier bucket has been started, its sum
// all-reduce starts on the group's communication thread while autograd
// goes on computing. Buckets start strictly in index order on every rank,
// so ranks never disagree on the order of collectives, even when some
// parameter gets no gradient on some rank: backward() ends by starting
// whatever is left (unused parameters count as zero), waits for all
// buckets and writes the averages back into the gradients.
#include "strata/strategies/ddp.h"

#include <torch/nn/module.h>

#include <mutex>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "grad_hooks.h"

namespace strata::strategies {

constexpr int64_t kFirstBucketBytes = 1024 * 1024;

struct DDPStrategy::Reducer {
  struct Bucket {
    std::vector<size_t> params;   // indices into Reducer::params
    std::vector<int64_t> offsets; // element offset of each param in buffer
    at::Tensor buffer;
    size_t pending = 0;
    comm::WorkPtr work;
  };

  comm::Group group;
  std::vector<at::Tensor> params;
  std::vector<std::pair<size_t, size_t>> location;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  std::vector<bool> ready;
  size_t next_to_launch = 0;
  bool sync_enabled = true;
  std::mutex mutex;

  Reducer(comm::Group g, std::vector<at::Tensor> ps, int64_t bucket_cap_bytes)
      : group(std::move(g)), params(std::move(ps)) {
    location.resize(params.size());
    ready.assign(params.size(), false);
    Bucket current;
    int64_t current_bytes = 0;
    auto flush = [&] {
      if (current.params.empty()) return;
      int64_t numel = 0;
      for (size_t i : current.params) {
        current.offsets.push_back(numel);
        numel += params[i].numel();
      }
      current.buffer = at::zeros({numel}, params[current.params.front()].options().requires_grad(false));
      current.pending = current.params.size();
      buckets.push_back(std::move(current));
      current = Bucket();
      current_bytes = 0;
    };
    for (size_t k = params.size(); k-- > 0;) {
      const at::Tensor& p = params[k];
      int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      bool other_kind = !current.params.empty() &&
                        (params[current.params.front()].scalar_type() != p.scalar_type() ||
                         params[current.params.front()].device() != p.device());
      // Note [First bucket]: as in PyTorch's DDP, the first bucket is capped
      // at 1 MB so that communication starts early in backward.
      int64_t cap = buckets.empty() ? std::min<int64_t>(bucket_cap_bytes, kFirstBucketBytes) : bucket_cap_bytes;
      if (other_kind || (current_bytes > 0 && current_bytes + bytes > cap)) flush();
      location[k] = {buckets.size(), current.params.size()};
      current.params.push_back(k);
      current_bytes += bytes;
    }
    flush();
  }

  at::Tensor slot(size_t index) {
    auto [b, s] = location[index];
    return buckets[b].buffer.narrow(0, buckets[b].offsets[s], params[index].numel());
  }

  // Called by the gradient hook of params[index] during backward; false
  // when it was ignored (synchronisation off, or seen already).
  bool on_grad_ready(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync_enabled || ready[index]) return false;
    mark_ready(index);
    launch_ready_buckets();
    return true;
  }

  // Copies params[index]'s gradient (zero when it has none) into its bucket.
  void mark_ready(size_t index) {
    const at::Tensor& grad = params[index].grad();
    if (grad.defined()) {
      slot(index).copy_(grad.reshape({-1}));
    } else {
      slot(index).zero_();
    }
    ready[index] = true;
    --buckets[location[index].first].pending;
  }

  void launch_ready_buckets() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_to_launch];
      bucket.work = group.all_reduce_async(bucket.buffer, comm::ReduceOp::kSum);
      ++next_to_launch;
    }
  }

  // After loss.backward(): start what is left, wait, write the averages back.
  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync_enabled) return;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) mark_ready(i);  // no gradient from this backward: counts as its current grad or zero
    }
    launch_ready_buckets();
    double scale = 1.0 / group.size();
    for (Bucket& bucket : buckets) {
      bucket.work->wait();
      bucket.work.reset();
      if (group.size() > 1) bucket.buffer.mul_(scale);
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& p = params[i];
      at::Tensor averaged = slot(i).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else if (averaged.abs().max().item<double>() != 0.0) {
        p.mutable_grad() = averaged.clone();
      }
    }
    reset();
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), false);
    for (Bucket& bucket : buckets) bucket.pending = bucket.params.size();
    next_to_launch = 0;
  }
};

DDPStrategy::DDPStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision,
                         DDPOptions options)
    : Strategy(std::move(accelerator), std::move(precision)), options_(std::move(options)) {
  STRATA_CHECK(options_.bucket_cap_mb > 0, ConfigError, "[ddp] bucket_cap_mb must be > 0, got ",
               options_.bucket_cap_mb);
  STRATA_CHECK(options_.checkpoint_io.is_null() || options_.checkpoint_io.empty(), ConfigError,
               "[ddp] checkpoint_io plugins are not supported; leave checkpoint_io empty");
}

DDPStrategy::~DDPStrategy() = default;

void DDPStrategy::setup_environment() {
  Strategy::setup_environment();
  setup_parallel_environment(options_.parallel_devices, options_.debug);
}

// What DDP keeps per module set up: its buckets and its gradient hooks.
struct DDPStrategy::Replica {
  ModulePtr module;
  std::shared_ptr<Reducer> reducer;
  std::unique_ptr<GradHooks> hooks;
};

DDPStrategy::Replica* DDPStrategy::replica_of(const torch::nn::Module& module) const {
  for (const auto& replica : replicas_) {
    if (replica->module.get() == &module) return replica.get();
  }
  return nullptr;
}

ModulePtr DDPStrategy::setup_module(ModulePtr module) {
  STRATA_CHECK(module != nullptr, ConfigError, "[ddp] setup_module got a null module");
  if (replica_of(*module) != nullptr) {
    log::warning("[ddp] the module is already set up; setup_module returns it as it is");
    return module;
  }
  module = Strategy::setup_module(std::move(module));
  if (options_.sync_module_states && world_size() > 1) {
    torch::NoGradGuard no_grad;
    for (at::Tensor p : module->parameters()) group_.broadcast(p, 0);
    for (at::Tensor b : module->buffers()) group_.broadcast(b, 0);
  }
  // Tied parameters appear once in parameters(): one hook each.
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : module->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  auto replica = std::make_unique<Replica>();
  replica->module = module;
  replica->reducer = std::make_shared<Reducer>(group_, params, options_.bucket_cap_mb * 1024 * 1024);
  std::weak_ptr<Reducer> weak = replica->reducer;
  replica->hooks = std::make_unique<GradHooks>([weak](size_t i) {
    auto reducer = weak.lock();
    return reducer && reducer->on_grad_ready(i);
  });
  for (size_t i = 0; i < params.size(); ++i) replica->hooks->add(params[i], i);
  replicas_.push_back(std::move(replica));
  return module;
}

void DDPStrategy::backward(const at::Tensor& loss) {
  for (const auto& replica : replicas_) replica->hooks->check_no_stray_backward("ddp");
  Strategy::backward(loss);
  if (replicas_.empty()) return;
  // Every module's buckets, in set-up order on every rank: a module this
  // backward did not reach reduces zeros and leaves its gradients as they
  // were (Note [Gradient buckets]).
  for (const auto& replica : replicas_) {
    replica->reducer->finish();
    replica->hooks->end_backward();
  }
  report_step_communication(++step_, options_.debug);
}

Scope DDPStrategy::no_backward_sync(torch::nn::Module& module, bool enabled) {
  require_set_up(module, "no_backward_sync");
  Replica* replica = replica_of(module);
  if (!enabled || replica == nullptr) return Scope();
  return set_for_scope(replica->reducer, &Reducer::sync_enabled, false);
}

void DDPStrategy::teardown() {
  // Drop the hooks before the modules outlive the strategy.
  replicas_.clear();
  Strategy::teardown();
}

size_t DDPStrategy::num_buckets() const {
  size_t n = 0;
  for (const auto& replica : replicas_) n += replica->reducer->buckets.size();
  return n;
}

}  // namespace strata::strategies
