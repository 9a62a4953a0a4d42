// Synchronised batch norm (Lightning's sync_batchnorm) for C++ modules,
// at the op: BatchNorm layers of a module set up with sync_batchnorm
// normalise, in training, with the mean and variance of the global batch.
//
// Note [Synchronised batch norm]
// PyTorch converts a model's BatchNorm modules to SyncBatchNorm modules
// (convert_sync_batchnorm). A C++ module's members are typed
// (`torch::nn::BatchNorm2d bn;`), so a layer's class cannot be swapped
// under them; the change is made where every BatchNorm's forward goes
// instead, the op aten::batch_norm. strata registers, on the first
// apply_sync_batchnorm, a kernel for it on the AutogradCPU and AutogradCUDA
// dispatch keys. aten::batch_norm has a CompositeImplicitAutograd kernel
// and none of its own on those keys; the dispatcher prefers a kernel
// registered on a key itself to the composite one, so every batch_norm on
// a CPU or CUDA tensor reaches ours, which calls at::native::batch_norm,
// the function the composite kernel is, with the same arguments: a layer
// that is not registered computes exactly what it did (a test checks the
// bits). A registered layer (found by its running_mean buffer, or its
// weight when it keeps no statistics) in training mode instead runs
// sync_batch_norm below, whose backward is a node of our own:
// - forward: the sum per channel and the count all-reduced, so the mean
//   is the global batch's; then the sum of squared deviations from it
//   all-reduced (two passes, as a one-process batch norm's variance, not
//   the cancellation-prone E[x^2] - mean^2); y = (x - mean) * invstd *
//   weight + bias; running statistics updated from the global mean and
//   unbiased variance, as one process on the whole batch would;
// - backward: sum(dy) and sum(dy * xhat) per channel all-reduced, and
//   dx = weight * invstd * (dy - sum(dy)/n - xhat * sum(dy * xhat)/n) with
//   the global sums and count n; the weight's and bias's gradients are
//   this rank's own (sum(dy * xhat), sum(dy)), which the strategy then
//   averages as any gradient. With each rank's loss the mean over its
//   share, dy is world_size times the one-process dy, so dx is too, and
//   the averaged parameter gradients equal one process's (as PyTorch's
//   SyncBatchNorm).
// The collectives run on the strategy's group in call order, with DDP's
// and FSDP's: every rank runs the same graph, in the same order (CPU
// autograd runs a graph's nodes in a fixed order), so they match. Eval
// mode (running statistics) is never synchronised. Not on xla devices.
#include "sync_batchnorm.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/batch_norm_native.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {
namespace {

// A registered layer: the group it synchronises over, and who registered it.
struct SyncedLayer {
  comm::Group group;
  const void* owner = nullptr;
  at::Tensor key;  // held, so that its TensorImpl is not reused while registered
};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const c10::TensorImpl*, SyncedLayer> layers;
  std::atomic<size_t> count{0};  // layers.size(), read without the lock
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives every static destructor that may run a batch norm
  return *r;
}

// The tensor a layer is found by: its running mean, else its weight.
at::Tensor layer_key(const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& weight) {
  if (running_mean && running_mean->defined()) return *running_mean;
  if (weight && weight->defined()) return *weight;
  return at::Tensor();
}

std::optional<comm::Group> synced_group(const at::Tensor& key) {
  if (!key.defined()) return std::nullopt;
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.layers.find(key.unsafeGetTensorImpl());
  if (it == r.layers.end()) return std::nullopt;
  return it->second.group;
}

// Reductions over every dim but the channels (dim 1), and the shape that
// broadcasts a per-channel vector against the input.
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return shape;
}

// The statistics are taken in float for reduced-precision inputs.
at::ScalarType stats_dtype(const at::Tensor& input) {
  return at::isReducedFloatingType(input.scalar_type()) ? at::kFloat : input.scalar_type();
}

struct SyncBatchNormBackward : torch::autograd::Node {
  comm::Group group;
  torch::autograd::SavedVariable input_, weight_;
  at::Tensor mean, invstd;  // per channel, in the statistics' dtype
  double count = 0;
  bool has_weight = false, has_bias = false;
  at::ScalarType bias_dtype = at::kFloat;

  std::string name() const override { return "SyncBatchNormBackward"; }
  void release_variables() override {
    input_.reset_data();
    weight_.reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor input = input_.unpack(getptr());
    const at::Tensor weight = has_weight ? weight_.unpack(getptr()) : at::Tensor();
    const at::ScalarType acc = stats_dtype(input);
    const std::vector<int64_t> dims = reduced_dims(input), shape = channel_shape(input);
    const int64_t channels = input.size(1);
    at::Tensor x = input.to(acc);
    at::Tensor dy = grads[0].defined() ? grads[0].to(acc) : at::zeros_like(x);
    at::Tensor xhat = (x - mean.view(shape)) * invstd.view(shape);
    at::Tensor sum_dy = dy.sum(dims);
    at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    torch::autograd::variable_list out(3);
    if (task_should_compute_output(0)) {
      at::Tensor global = at::cat({sum_dy, sum_dy_xhat});
      group.all_reduce(global, comm::ReduceOp::kSum);
      at::Tensor mean_dy = global.narrow(0, 0, channels) / count;
      at::Tensor mean_dy_xhat = global.narrow(0, channels, channels) / count;
      at::Tensor scale = has_weight ? invstd * weight.to(acc) : invstd;
      at::Tensor dx = (dy - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape)) * scale.view(shape);
      out[0] = dx.to(input.scalar_type());
    }
    if (has_weight && task_should_compute_output(1)) out[1] = sum_dy_xhat.to(weight.scalar_type());
    if (has_bias && task_should_compute_output(2)) out[2] = sum_dy.to(bias_dtype);
    return out;
  }
};

at::Tensor sync_batch_norm(comm::Group group, const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                           double momentum, double eps) {
  STRATA_CHECK(input.dim() >= 2, ConfigError, "[sync_batchnorm] batch norm needs an input of at least 2 dims "
               "(batch, channels, ...), got ", input.sizes());
  const bool needs_grad = at::GradMode::is_enabled() && (input.requires_grad() ||
                                                         (weight.defined() && weight.requires_grad()) ||
                                                         (bias.defined() && bias.requires_grad()));
  at::Tensor output, mean, invstd;
  double count = 0;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing recorded: the node below is the history
    const at::ScalarType acc = stats_dtype(input);
    const std::vector<int64_t> dims = reduced_dims(input), shape = channel_shape(input);
    const int64_t channels = input.size(1);
    at::Tensor x = input.to(acc);
    at::Tensor sum_and_count =
        at::cat({x.sum(dims), at::full({1}, static_cast<double>(input.numel() / std::max<int64_t>(channels, 1)),
                                       x.options())});
    group.all_reduce(sum_and_count, comm::ReduceOp::kSum);
    count = sum_and_count[channels].item<double>();
    STRATA_CHECK(count > 1, ConfigError, "[sync_batchnorm] expected more than 1 value per channel over all ranks "
                 "when training, got input ", input.sizes(), " on this rank and ", count, " values in all");
    mean = sum_and_count.narrow(0, 0, channels) / count;
    at::Tensor centered = x - mean.view(shape);
    at::Tensor squares = centered.square().sum(dims);
    group.all_reduce(squares, comm::ReduceOp::kSum);
    at::Tensor var = squares / count;
    invstd = (var + eps).rsqrt();
    at::Tensor y = centered * invstd.view(shape);
    if (weight.defined()) y = y * weight.to(acc).view(shape);
    if (bias.defined()) y = y + bias.to(acc).view(shape);
    output = y.to(input.scalar_type());
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
    }
    if (running_var.defined()) {
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
  }
  if (needs_grad) {
    auto node = c10::make_intrusive<SyncBatchNormBackward>();
    node->group = std::move(group);
    node->input_ = torch::autograd::SavedVariable(input, false);
    node->has_weight = weight.defined();
    node->has_bias = bias.defined();
    if (node->has_bias) node->bias_dtype = bias.scalar_type();
    if (node->has_weight) node->weight_ = torch::autograd::SavedVariable(weight, false);
    node->mean = mean;
    node->invstd = invstd;
    node->count = count;
    node->set_next_edges(torch::autograd::collect_next_edges(input, weight, bias));
    torch::autograd::set_history(output, node);
  }
  return output;
}

// The kernel on AutogradCPU and AutogradCUDA (Note [Synchronised batch norm]).
at::Tensor batch_norm_kernel(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                             const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
                             bool cudnn_enabled) {
  if (training && registry().count.load(std::memory_order_acquire) > 0) {
    if (std::optional<comm::Group> group = synced_group(layer_key(running_mean, weight))) {
      auto or_none = [](const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); };
      return sync_batch_norm(std::move(*group), input, or_none(weight), or_none(bias), or_none(running_mean),
                             or_none(running_var), momentum, eps);
    }
  }
  return at::native::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                cudnn_enabled);
}

void register_kernel_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the life of the process: the kernels stay registered.
    static auto* cpu = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCPU, __FILE__,
                                          __LINE__);
    static auto* cuda = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCUDA, __FILE__,
                                           __LINE__);
    cpu->impl("batch_norm", TORCH_FN(batch_norm_kernel));
    cuda->impl("batch_norm", TORCH_FN(batch_norm_kernel));
  });
}

template <class Layer>
bool add_layer(torch::nn::Module& module, const comm::Group& group, const void* owner, size_t& added) {
  auto* layer = dynamic_cast<Layer*>(&module);
  if (layer == nullptr) return false;
  at::Tensor key = layer->running_mean.defined() ? layer->running_mean : layer->weight;
  if (!key.defined()) {
    log::warning("[sync_batchnorm] a ", module.name(), " has neither running statistics nor an affine weight: it "
                 "is not synchronised");
    return true;
  }
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.layers[key.unsafeGetTensorImpl()] = SyncedLayer{group, owner, key};
  r.count.store(r.layers.size(), std::memory_order_release);
  ++added;
  return true;
}

}  // namespace

namespace detail {

void release_sync_batchnorm(const void* owner) {
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  for (auto it = r.layers.begin(); it != r.layers.end();) {
    it = it->second.owner == owner ? r.layers.erase(it) : std::next(it);
  }
  r.count.store(r.layers.size(), std::memory_order_release);
}

bool batchnorm_kernel_registered(const at::Tensor& key) { return synced_group(key).has_value(); }

}  // namespace detail

size_t Strategy::apply_sync_batchnorm(torch::nn::Module& module) {
  if (!sync_batchnorm() || world_size() <= 1) return 0;
  STRATA_CHECK(accelerator_->reads_inside_step(), ConfigError, "[", name(), "] sync_batchnorm is not supported on a lazy device ('",
               accelerator_->name(), "'): its batch norms run in the compiled step. Turn sync_batchnorm off");
  register_kernel_once();
  size_t added = 0;
  module.apply([&](torch::nn::Module& child) {
    if (add_layer<torch::nn::BatchNorm1dImpl>(child, group_, this, added)) return;
    if (add_layer<torch::nn::BatchNorm2dImpl>(child, group_, this, added)) return;
    add_layer<torch::nn::BatchNorm3dImpl>(child, group_, this, added);
  });
  return added;
}

}  // namespace strata::strategies
