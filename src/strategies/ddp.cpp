// DDPStrategy: bucketed gradient all-reduce overlapped with backward, the
// gradients living in their buckets.
//
// Note [Gradient buckets]
// Parameters are grouped into buckets of at most bucket_cap_mb (the first
// at most 1 MB, Note [First bucket]), at first in reverse registration
// order (roughly the order backward produces their gradients), and once
// more after the first synchronised backward in the order its gradients
// were really ready (Note [Rebuilt bucket order]). A post hook on each
// parameter's gradient accumulator marks the gradient ready; when every
// gradient of a bucket is ready and every earlier bucket has been started,
// its sum all-reduce starts on the group's communication thread while
// autograd goes on computing. Buckets start strictly in index order on
// every rank, so ranks never disagree on the order of collectives, even
// when some parameter gets no gradient on some rank: backward() ends by
// starting whatever is left (unused parameters count as zero), waits for
// all buckets (already scaled to the average: Note [Gradients as bucket views]).
//
// Note [Gradients as bucket views]
// As PyTorch's gradient_as_bucket_view, each parameter's .grad is a view of
// its slot in the bucket's flat buffer once its gradient is in, so the
// gradients exist once in memory and nothing is copied out after the
// all-reduce:
// - a parameter without a gradient (an optimizer's zero_grad sets them to
//   none since LibTorch 2) gets autograd's fresh gradient; the hook copies
//   it into its slot, multiplied by 1 / world size in the same pass (as
//   PyTorch's DDP does), and re-points .grad to the slot. That is one pass
//   over the gradient, where accumulating into a zeroed slot and scaling
//   after the all-reduce took three;
// - a gradient that is its slot already (not zeroed since the last step,
//   or accumulated under no_sync into it) is scaled in place;
// - the buckets are all-reduced with a sum, which is then the mean;
// - a parameter that got no gradient on any rank ends as it began, without
//   one, as in single-process training;
// - non-contiguous parameters keep their own gradients (copied in and out).
// The gradient shares the bucket's storage but is not an autograd view
// (grad_slot), so optimizers' zero_grad, which detaches it, works. At 2 (or
// any power of two) ranks, scaling before or after the sum gives the same
// bits; at other world sizes the mean differs from sum-then-scale in the
// last bit, and equals what PyTorch's DDP computes.
//
// Note [Buffers from rank 0]
// PyTorch's DDP (broadcast_buffers=True) broadcasts rank 0's buffers before
// a forward that follows a synchronised training forward, so BatchNorm's
// running statistics never drift apart: every rank's forward starts from
// rank 0's, and rank 0's own evolve as in its one-process run. C++ modules
// have no forward hook, so the broadcast runs at the end of backward(),
// after the gradients are averaged: that is before the next forward, and
// only after a synchronised step (under no_backward_sync no broadcast, as
// in PyTorch, where the forward after a no_sync forward skips it too). At
// setup the buffers are broadcast as well, so the first forward starts
// from rank 0's. Not before backward: a module in eval mode saves its
// running statistics for backward, and overwriting them in place would
// fail autograd's version check. One broadcast per dtype and device of the
// buffers (flattened together), on every rank in the modules' set-up
// order. Not under XlaStrategy: Lightning's XLAStrategy broadcasts no
// buffers, and a step's collectives are recorded into its program.
#include "strata/strategies/ddp.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "grad_hooks.h"

namespace strata::strategies {

constexpr int64_t kFirstBucketBytes = 1024 * 1024;

namespace {

// Overwrites `buffers` with rank 0's: one broadcast per dtype and device,
// in the order the buffers come (Note [Buffers from rank 0]).
void broadcast_from_rank_zero(comm::Group& group, const std::vector<at::Tensor>& buffers) {
  torch::NoGradGuard no_grad;
  std::vector<bool> done(buffers.size(), false);
  for (size_t first = 0; first < buffers.size(); ++first) {
    if (done[first] || !buffers[first].defined()) continue;
    std::vector<at::Tensor> same_kind;
    for (size_t i = first; i < buffers.size(); ++i) {
      const at::Tensor& b = buffers[i];
      if (done[i] || !b.defined() || b.scalar_type() != buffers[first].scalar_type() ||
          b.device() != buffers[first].device()) {
        continue;
      }
      done[i] = true;
      same_kind.push_back(b);
    }
    if (same_kind.size() == 1 && same_kind.front().is_contiguous()) {
      group.broadcast(same_kind.front(), 0);
      continue;
    }
    std::vector<at::Tensor> flat;
    for (const at::Tensor& b : same_kind) flat.push_back(b.reshape({-1}));
    at::Tensor joined = at::cat(flat);
    group.broadcast(joined, 0);
    int64_t offset = 0;
    for (at::Tensor b : same_kind) {
      b.copy_(joined.narrow(0, offset, b.numel()).view(b.sizes()));
      offset += b.numel();
    }
  }
}

}  // namespace

struct DDPStrategy::Reducer {
  struct Bucket {
    std::vector<size_t> params;    // indices into Reducer::params
    std::vector<int64_t> offsets;  // element offset of each param in buffer
    at::Tensor buffer;
    size_t pending = 0;
    comm::WorkPtr work;
  };

  comm::Group group;
  std::vector<at::Tensor> params;
  int64_t bucket_cap_bytes;
  std::vector<bool> viewable;                       // contiguous: .grad may be a view of its slot
  std::vector<std::pair<size_t, size_t>> location;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  std::vector<bool> ready;       // the hook (or finish) marked it this backward
  double scale = 1.0;            // 1 / world size
  at::Tensor scale_by_dtype;     // scale as a 0-d tensor (scale_tensor)
  std::vector<size_t> ready_order;  // the order of the first synchronised backward
  bool order_rebuilt = false;
  size_t next_to_launch = 0;
  bool sync_enabled = true;
  bool lazy = false;  // on a lazy device (xla): Note [A gradient no rank had]
  std::mutex mutex;

  Reducer(comm::Group g, std::vector<at::Tensor> ps, int64_t cap_bytes, bool on_lazy_device)
      : group(std::move(g)), params(std::move(ps)), bucket_cap_bytes(cap_bytes), lazy(on_lazy_device) {
    ready.assign(params.size(), false);
    scale = 1.0 / group.size();
    for (const at::Tensor& p : params) viewable.push_back(p.layout() == at::kStrided && p.is_contiguous());
    std::vector<size_t> order;
    for (size_t k = params.size(); k-- > 0;) order.push_back(k);
    build_buckets(order);
  }

  // Groups params in `order` (first ready first) into buckets and moves
  // every gradient into its slot (Note [Gradients as bucket views]).
  void build_buckets(const std::vector<size_t>& order) {
    std::vector<Bucket> old = std::move(buckets);  // keeps the old slots alive while gradients move
    buckets.clear();
    location.assign(params.size(), {0, 0});
    Bucket current;
    int64_t current_bytes = 0;
    auto flush = [&] {
      if (current.params.empty()) return;
      int64_t numel = 0;
      for (size_t i : current.params) {
        current.offsets.push_back(numel);
        numel += params[i].numel();
      }
      // The bucket lives where its parameters do (every device alike).
      current.buffer = at::zeros({numel}, params[current.params.front()].options().requires_grad(false));
      current.pending = current.params.size();
      buckets.push_back(std::move(current));
      current = Bucket();
      current_bytes = 0;
    };
    for (size_t k : order) {
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
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& grad = params[i].mutable_grad();
      if (!grad.defined() || !viewable[i]) continue;
      slot(i).copy_(grad.reshape({-1}));
      grad = grad_slot(i);
    }
  }

  at::Tensor slot(size_t index) {
    auto [b, s] = location[index];
    return buckets[b].buffer.narrow(0, buckets[b].offsets[s], params[index].numel());
  }

  // The gradient tensor of a viewable params[index]: its slot, with the
  // parameter's shape, sharing the bucket's storage. Made with set_ rather
  // than view(), so autograd does not see a view: LibTorch's
  // Optimizer::zero_grad calls detach_() on every gradient, which views
  // refuse.
  at::Tensor grad_slot(size_t index) {
    auto [b, s] = location[index];
    const at::Tensor& buffer = buckets[b].buffer;
    const at::IntArrayRef sizes = params[index].sizes();
    std::vector<int64_t> strides(sizes.size(), 1);
    for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
    torch::NoGradGuard no_grad;
    at::Tensor grad = at::empty({0}, buffer.options());
    grad.set_(buffer.storage(), buffer.storage_offset() + buckets[b].offsets[s], sizes, strides);
    return grad;
  }

  bool is_slot(size_t index) {
    const at::Tensor& grad = params[index].grad();
    return grad.defined() && grad.data_ptr() == slot(index).data_ptr() && grad.is_contiguous();
  }

  // Called by the gradient hook of params[index] during backward; false
  // when it was ignored (synchronisation off, or seen already).
  bool on_grad_ready(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync_enabled || ready[index]) return false;
    if (!order_rebuilt) ready_order.push_back(index);
    mark_ready(index);
    launch_ready_buckets();
    return true;
  }

  // Puts params[index]'s gradient (zero when it has none), divided by the
  // world size, in its slot (Note [Gradients as bucket views]).
  void mark_ready(size_t index) {
    at::Tensor& grad = params[index].mutable_grad();
    torch::NoGradGuard no_grad;
    if (!grad.defined()) {
      slot(index).zero_();
    } else if (is_slot(index)) {
      if (group.size() > 1) slot(index).mul_(scale);  // accumulated in place
    } else {
      at::Tensor place = slot(index);
      if (group.size() > 1) {
        at::mul_out(place, grad.reshape({-1}), scale_tensor(grad));  // one pass: scaled while copied
      } else {
        place.copy_(grad.reshape({-1}));
      }
      if (viewable[index]) grad = grad_slot(index);
    }
    ready[index] = true;
    --buckets[location[index].first].pending;
  }

  // 1 / world size as a 0-d tensor of the gradient's dtype: the factor
  // PyTorch's DDP multiplies by while it copies into the bucket.
  const at::Tensor& scale_tensor(const at::Tensor& grad) {
    if (!scale_by_dtype.defined() || scale_by_dtype.scalar_type() != grad.scalar_type() ||
        scale_by_dtype.device() != grad.device()) {
      scale_by_dtype = at::scalar_tensor(scale, grad.options().requires_grad(false));
    }
    return scale_by_dtype;
  }

  void launch_ready_buckets() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_to_launch];
      bucket.work = group.all_reduce_async(bucket.buffer, comm::ReduceOp::kSum);
      ++next_to_launch;
    }
  }

  // After loss.backward(): start what is left, wait, scale to the average.
  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync_enabled) return;
    // No gradient from this backward on this rank: it counts as zero here.
    std::vector<bool> none_here(params.size(), false);
    for (size_t i = 0; i < params.size(); ++i) {
      if (ready[i]) continue;
      none_here[i] = !params[i].grad().defined();
      mark_ready(i);
    }
    launch_ready_buckets();
    for (Bucket& bucket : buckets) {
      bucket.work->wait();
      bucket.work.reset();
    }
    torch::NoGradGuard no_grad;
    const std::vector<bool> none_anywhere = no_rank_had(none_here);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& grad = params[i].mutable_grad();
      at::Tensor averaged = slot(i).view(params[i].sizes());
      if (none_anywhere[i]) {
        grad.reset();  // no rank had one: none, as in single-process training
      } else if (!grad.defined()) {
        grad = viewable[i] ? grad_slot(i) : averaged.clone();
      } else if (!is_slot(i)) {
        grad.copy_(averaged);
      }
    }
    if (!order_rebuilt) rebuild_order();
    reset();
  }

  // Note [A gradient no rank had]
  // A parameter this backward gave a gradient on no rank keeps none, as in
  // one process. On the CPU and CUDA a parameter without one here is
  // looked at once its average is in: an average of all zeros is taken to
  // mean that no rank had one. On a lazy device reading the average would
  // run the step's program so far, once per such parameter (a second
  // module's parameters in a backward that does not reach them, as the
  // DCGAN's generator in the discriminator's backward), so there every
  // rank says on the host which parameters it had, in one all-reduce of
  // flags every backward, and no program runs.
  std::vector<bool> no_rank_had(const std::vector<bool>& none_here) {
    std::vector<bool> out(params.size(), false);
    if (!lazy) {
      for (size_t i = 0; i < params.size(); ++i)
        out[i] = none_here[i] && slot(i).abs().max().item<double>() == 0.0;
      return out;
    }
    at::Tensor had = at::zeros({static_cast<int64_t>(params.size())}, at::kInt);
    int32_t* flags = had.data_ptr<int32_t>();
    for (size_t i = 0; i < params.size(); ++i) flags[i] = none_here[i] ? 0 : 1;
    at::Tensor shared = had.to(group.device());
    group.all_reduce(shared, comm::ReduceOp::kSum);
    had = shared.cpu();
    flags = had.data_ptr<int32_t>();
    for (size_t i = 0; i < params.size(); ++i) out[i] = flags[i] == 0;
    return out;
  }

  // Note [Rebuilt bucket order]
  // After the first synchronised backward, the buckets are rebuilt in the
  // order its gradients became ready, so that the first bucket fills (and
  // its all-reduce starts) as early as it can. Ranks may observe different
  // orders (data-dependent control flow, thread timing); all take rank 0's,
  // broadcast, so they keep launching the same buckets in the same order.
  // Parameters rank 0 did not see ready come last, in reverse registration
  // order. Done once, as PyTorch's DDP does.
  void rebuild_order() {
    order_rebuilt = true;
    if (params.empty()) return;
    const int64_t n = static_cast<int64_t>(params.size());
    at::Tensor observed = at::full({n}, -1, at::kLong);
    int64_t* slots = observed.data_ptr<int64_t>();
    for (size_t k = 0; k < ready_order.size() && k < params.size(); ++k) slots[k] = static_cast<int64_t>(ready_order[k]);
    ready_order.clear();
    // On the device the group's collectives take (a CUDA device for NCCL,
    // else the CPU): on xla replicas a host broadcast, which does not cut
    // the step's program in two.
    at::Tensor shared = observed.to(group.device());
    group.broadcast(shared, 0);
    observed = shared.cpu();
    std::vector<size_t> order;
    std::vector<bool> placed(params.size(), false);
    const int64_t* seen = observed.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) {
      int64_t i = seen[k];
      if (i < 0 || i >= n || placed[static_cast<size_t>(i)]) continue;
      placed[static_cast<size_t>(i)] = true;
      order.push_back(static_cast<size_t>(i));
    }
    for (size_t k = params.size(); k-- > 0;) {
      if (!placed[k]) order.push_back(k);
    }
    std::vector<size_t> current;
    for (const Bucket& bucket : buckets) current.insert(current.end(), bucket.params.begin(), bucket.params.end());
    if (order != current) build_buckets(order);
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
  sync_batchnorm_ = options_.sync_batchnorm;
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

bool DDPStrategy::broadcasts_buffers() const {
  return options_.broadcast_buffers && world_size() > 1;
}

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
  } else if (broadcasts_buffers()) {
    broadcast_from_rank_zero(group_, module->buffers());
  }
  // Tied parameters appear once in parameters(): one hook each.
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : module->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  auto replica = std::make_unique<Replica>();
  replica->module = module;
  replica->reducer = std::make_shared<Reducer>(group_, params, options_.bucket_cap_mb * 1024 * 1024,
                                                !accelerator_->reads_inside_step());
  std::weak_ptr<Reducer> weak = replica->reducer;
  replica->hooks = std::make_unique<GradHooks>([weak](size_t i) {
    auto reducer = weak.lock();
    return reducer && reducer->on_grad_ready(i);
  });
  for (size_t i = 0; i < params.size(); ++i) replica->hooks->add(params[i], i);
  replicas_.push_back(std::move(replica));
  apply_sync_batchnorm(*module);
  return module;
}

void DDPStrategy::backward(const at::Tensor& loss) {
  for (const auto& replica : replicas_) {
    replica->hooks->check_no_stray_backward("ddp");
  }
  Strategy::backward(loss);
  if (replicas_.empty()) return;
  // Every module's buckets, in set-up order on every rank: a module this
  // backward did not reach reduces zeros and leaves its gradients as they
  // were (Note [Gradient buckets]).
  for (const auto& replica : replicas_) {
    const bool synchronised = replica->reducer->sync_enabled;
    replica->reducer->finish();
    replica->hooks->end_backward();
    if (synchronised && broadcasts_buffers()) broadcast_from_rank_zero(group_, replica->module->buffers());
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

std::vector<std::vector<size_t>> DDPStrategy::bucket_layout(const torch::nn::Module& module) const {
  Replica* replica = replica_of(module);
  STRATA_CHECK(replica != nullptr, ConfigError, "[ddp] bucket_layout: the module was not set up by this strategy");
  std::vector<std::vector<size_t>> layout;
  for (const auto& bucket : replica->reducer->buckets) layout.push_back(bucket.params);
  return layout;
}

std::vector<at::Tensor> DDPStrategy::bucket_buffers(const torch::nn::Module& module) const {
  Replica* replica = replica_of(module);
  STRATA_CHECK(replica != nullptr, ConfigError, "[ddp] bucket_buffers: the module was not set up by this strategy");
  std::vector<at::Tensor> buffers;
  for (const auto& bucket : replica->reducer->buckets) buffers.push_back(bucket.buffer);
  return buffers;
}

}  // namespace strata::strategies
