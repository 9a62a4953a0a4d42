// FSDPStrategy, the facade: set-up, the training step and the reports; the
// algorithm lives beside it (unit.h: a unit and its state machine;
// fsdp_state.h: the units of a module and their schedule; sharded_param.h,
// collectives.h, schedule.cpp, wrap_policy.h, construction.cpp,
// checkpoint.cpp).
#include "strata/strategies/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <unordered_set>

#include "buffer_cache.h"
#include "construction.h"
#include "fsdp_state.h"
#include "strata/core/container_calls.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/core/module_hooks.h"
#include "strata/runtime/process.h"
#include "strata/strategies/recompute.h"
#include "wrap_policy.h"

namespace strata::strategies {
namespace {

using detail::FSDPState;

// What runs around the forward of a unit, or of a checkpointed module that
// is not a unit.
class FSDPForwardHooks : public ForwardHooks {
 public:
  FSDPForwardHooks(std::weak_ptr<FSDPState> state, std::optional<size_t> unit, bool checkpoint)
      : state_(std::move(state)), unit_(unit), checkpoint_(checkpoint) {}

  TensorList run(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body) override {
    seen = true;
    std::shared_ptr<FSDPState> state = state_.lock();
    if (!state) return body(inputs);
    if (unit_) state->pre_forward(*unit_);
    TensorList outputs;
    try {
      outputs = checkpoint_ ? recomputed_forward(body, inputs, module.buffers()) : body(inputs);
    } catch (...) {
      if (unit_) state->forward_failed(*unit_);
      throw;
    }
    if (unit_) state->post_forward(*unit_, outputs);
    return outputs;
  }

  bool checkpoints() const { return checkpoint_; }
  bool seen = false;     ///< the forward ran through these hooks
  bool checked = false;  ///< warn_unseen_recomputation looked at it

 private:
  std::weak_ptr<FSDPState> state_;
  std::optional<size_t> unit_;
  bool checkpoint_;
};

// How a model calls the module at `path` ("blocks.3" -> "blocks[3]",
// "layers.3.attn" -> "attn"), for hints.
std::string call_name(const std::string& path) {
  const size_t dot = path.rfind('.');
  std::string last = path.substr(dot == std::string::npos ? 0 : dot + 1);
  if (last.empty() || !std::all_of(last.begin(), last.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return last;
  }
  return call_name(dot == std::string::npos ? std::string() : path.substr(0, dot)) + "[" + last + "]";
}

// A checkpointed module whose forward is not seen (a typed call) keeps
// working, gathered on first use if it is a unit, but is not recomputed:
// after the first backward that follows its set-up, say so once.
void warn_unseen_recomputation(const FSDPState& state) {
  std::vector<torch::nn::Module*> checkpointed = state.checkpointed();
  for (const detail::Unit& unit : state.units()) checkpointed.push_back(&unit.module());
  std::string unseen, path_of_first;
  for (torch::nn::Module* m : checkpointed) {
    auto hooks = std::dynamic_pointer_cast<FSDPForwardHooks>(forward_hooks(*m));
    if (!hooks || !hooks->checkpoints() || hooks->checked) continue;
    hooks->checked = true;
    if (hooks->seen) continue;
    std::string path;
    for (const auto& item : state.root_module()->named_modules()) {
      if (item.value().get() == m) path = item.key();
    }
    unseen += (unseen.empty() ? "'" : ", '") + path + "' (" + m->name() + ")";
    if (path_of_first.empty()) path_of_first = path;
  }
  if (unseen.empty()) return;
  const std::string example = call_name(path_of_first);
  log::warning("[fsdp] activation checkpointing: the forward of ", unseen,
               " was not seen in the first step, so it ran without recomputation. strata sees the calls a "
               "torch::nn::Sequential makes, but not a direct call of a typed forward: where the model calls '",
               path_of_first, "', call it as strata::call(", example, ", x) instead of ", example,
               "->forward(x) (ignore this if the module was not used)");
}

// Buffers are kept whole, on the root device (before construction, which
// broadcasts them from rank 0 through the process group's backend).
void buffers_to(torch::nn::Module& module, c10::Device device) {
  torch::NoGradGuard no_grad;
  for (at::Tensor buffer : module.buffers()) {
    if (!buffer.is_meta() && buffer.device() != device) buffer.set_data(buffer.to(device));
  }
}

// Where the shards go: the root device, or, for a strategy used before
// launch (one process, no process group yet), local rank 0's device.
c10::Device shard_device(const Strategy& strategy) {
  return strategy.launched() ? strategy.root_device() : strategy.accelerator().device(0);
}

void check_compute_dtype(const FSDPOptions& options, const Precision& precision) {
  c10::ScalarType compute = options.compute_dtype.value_or(precision.compute_dtype());
  STRATA_CHECK(compute == c10::kFloat || compute == c10::kBFloat16 || compute == c10::kHalf, ConfigError,
               "[fsdp] compute_dtype must be float32, bfloat16 or float16, got ", compute);
  STRATA_CHECK(compute == c10::kFloat || precision.autocast(), ConfigError, "[fsdp] compute_dtype ", compute,
               " needs a mixed precision (e.g. 'bf16-mixed') so that inputs are cast too; precision is '",
               precision.name(), "'");
}

}  // namespace

FSDPStrategy::FSDPStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision,
                           FSDPOptions options)
    : Strategy(std::move(accelerator), std::move(precision)), options_(std::move(options)) {
  STRATA_CHECK(options_.checkpoint_io.is_null() || options_.checkpoint_io.empty(), ConfigError,
               "[fsdp] checkpoint_io plugins are not supported; leave checkpoint_io empty");
  check_compute_dtype(options_, precision_);
}

void FSDPStrategy::set_precision(Precision precision) {
  check_compute_dtype(options_, precision);
  Strategy::set_precision(std::move(precision));
}

FSDPStrategy::~FSDPStrategy() {
  routes_.clear();
  forget_gone_modules();
  for (const auto& state : states_) state->unhook();
}

detail::FSDPState* FSDPStrategy::state_of(const torch::nn::Module& module) const {
  for (const auto& state : states_) {
    // A module built where one held by value was (gone) is another module.
    if (state->root_module().get() == &module && state->root_alive()) return state.get();
  }
  return nullptr;
}

void FSDPStrategy::forget_gone_modules() {
  // Note [Modules held by value]: a module declared inside a function that
  // has returned; its units, hooks and reductions go with it.
  for (auto it = states_.begin(); it != states_.end();) {
    if ((*it)->root_alive()) {
      ++it;
      continue;
    }
    (*it)->unhook();
    it = states_.erase(it);
  }
}

void FSDPStrategy::setup_environment() {
  Strategy::setup_environment();
  setup_parallel_environment(options_.parallel_devices, options_.debug);
}

ModulePtr FSDPStrategy::setup_module(ModulePtr module) {
  STRATA_CHECK(module != nullptr, ConfigError, "[fsdp] setup_module got a null module");
  forget_gone_modules();
  if (state_of(*module) != nullptr) {
    log::warning("[fsdp] the module is already sharded; setup_module returns it as it is and does not apply "
                 "the policies again");
    return module;
  }
  // Each module set up gets its own units, hooks and reductions (a GAN's
  // generator and critic); a module sharded while it was built adopts its
  // pieces from presharded_, which keeps the other modules' pieces.
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (const auto& other : states_) {
    for (const auto& p : other->params()) sharded.insert(p.shard.unsafeGetTensorImpl());
  }
  c10::ScalarType compute = options_.compute_dtype.value_or(precision_.compute_dtype());
  const c10::Device device = shard_device(*this);
  auto state = std::make_shared<FSDPState>(module, group_, options_, compute, options_.reduce_dtype.value_or(compute),
                                           device);
  {
    detail::SetupDeviceScope on_device(device);
    buffers_to(*module, device);
    state->build(options_, presharded_.get(), sharded);
    state->place_shards(device);  // Note [Shards on the device]
  }
  if (presharded_ && presharded_->by_shard.empty()) presharded_.reset();
  modules_.push_back(module);
  states_.push_back(state);
  for (size_t u = 0; u < state->units().size(); ++u) {
    torch::nn::Module& unit_module = state->units()[u].module();
    bool checkpoint = detail::matches(options_.activation_checkpointing_policy, unit_module);
    set_forward_hooks(unit_module, std::make_shared<FSDPForwardHooks>(state, u, checkpoint));
  }
  state->watch_root();
  // Activation checkpointing applies to every instance of the listed types,
  // units or not.
  for (const auto& item : module->named_modules("", /*include_self=*/true)) {
    torch::nn::Module* m = item.value().get();
    if (!detail::matches(options_.activation_checkpointing_policy, *m)) continue;
    if (state->unit_of(*m)) continue;
    set_forward_hooks(*m, std::make_shared<FSDPForwardHooks>(state, std::nullopt, true));
    state->add_checkpointed(m);
  }
  // The calls a Sequential makes to its children, and its own forward, now
  // reach the hooks (core/container_calls.h).
  if (borrowed(module)) {
    // Note [Modules held by value]: teardown, which restores the routes,
    // may come after the root is gone; its children are kept, so a
    // Sequential root's own forward is the one call not routed.
    for (const ModulePtr& child : module->children()) routes_.push_back(route_container_calls(*child));
  } else {
    routes_.push_back(route_container_calls(*module));
  }
  apply_sync_batchnorm(*module);
  // The unsharded values are gone; training allocates in other sizes
  // (Note [FSDP's buffer cache]), so give their pages back.
  runtime::release_free_memory();
  return module;
}

void FSDPStrategy::setup_optimizer(torch::optim::Optimizer& optimizer) {
  STRATA_CHECK(!states_.empty(), ConfigError,
               "[fsdp] setup_optimizer before setup_module: call setup_module(model) first, then build the optimizer "
               "from model->parameters() (the sharded parameters), then setup_optimizer");
  std::unordered_set<const c10::TensorImpl*> shards;
  for (const auto& state : states_) {
    for (const auto& p : state->params()) shards.insert(p.shard.unsafeGetTensorImpl());
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      STRATA_CHECK(shards.count(p.unsafeGetTensorImpl()) > 0, ConfigError,
                   "[fsdp] the optimizer holds a parameter (shape ", p.sizes(),
                   ") that is not a sharded parameter of the module set up: FSDP replaces the module's parameters "
                   "in setup_module, so create the optimizer after setup_module, from the returned module's "
                   "parameters(), then call setup_optimizer");
    }
  }
}

ModulePtr FSDPStrategy::setup_module_and_optimizers(ModulePtr, const std::vector<torch::optim::Optimizer*>&) {
  throw ConfigError(
      "[fsdp] setup_module_and_optimizers is not supported: FSDP shards the parameters, so an optimizer built "
      "before that holds the wrong tensors. Call setup_module(model), build the optimizer from "
      "model->parameters(), then setup_optimizer(optimizer)");
}

void FSDPStrategy::module_to_device(torch::nn::Module&) {}

Scope FSDPStrategy::module_init_context(std::optional<bool> empty_init) {
  if (!empty_init.value_or(false)) return Scope();
  return meta_device_scope();  // Note [Meta-device construction]
}

Scope FSDPStrategy::module_sharded_context() {
  STRATA_CHECK(launched(), ConfigError,
               "[fsdp] module_sharded_context needs the process group: call it inside fabric.launch (after "
               "setup_environment)");
  STRATA_CHECK(states_.empty(), ConfigError, "[fsdp] module_sharded_context after setup_module: build the "
               "models inside the context first, then call setup_module");
  if (!presharded_) presharded_ = std::make_shared<detail::Presharded>();
  const c10::ScalarType compute = options_.compute_dtype.value_or(precision_.compute_dtype());
  ModuleBuiltHandler previous = set_module_built_handler(
      detail::shard_when_built(presharded_, options_.auto_wrap_policy, world_size(), global_rank(), compute));
  // Units built inside are sharded on the root device (Note [Setup device]).
  auto on_device = std::make_shared<detail::SetupDeviceScope>(shard_device(*this));
  return Scope([previous, on_device]() mutable {
    on_device.reset();
    set_module_built_handler(std::move(previous));
  });
}

void FSDPStrategy::backward(const at::Tensor& loss) {
  Strategy::backward(loss);
  forget_gone_modules();
  if (states_.empty()) return;
  // In set-up order on every rank; a module whose forward did not run in
  // this step has nothing to reduce.
  for (const auto& state : states_) state->finalize_backward();
  report_step_communication(++step_, options_.debug);
  for (const auto& state : states_) warn_unseen_recomputation(*state);
}

Scope FSDPStrategy::no_backward_sync(torch::nn::Module& module, bool enabled) {
  require_set_up(module, "no_backward_sync");
  detail::FSDPState* state = state_of(module);
  if (!enabled || state == nullptr) return Scope();
  return state->no_backward_sync();
}

at::Tensor FSDPStrategy::reduce_norm(const at::Tensor& local, bool is_max) {
  at::Tensor total = local.clone();
  group_.all_reduce(total, is_max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum);
  return total;
}

void FSDPStrategy::teardown() {
  routes_.clear();
  forget_gone_modules();
  for (const auto& state : states_) {
    state->reshard_all();
    state->unhook();
  }
  Strategy::teardown();
  states_.clear();
  presharded_.reset();
  detail::BufferCache::host().release();
}

FSDPStrategy::BufferBytes FSDPStrategy::buffer_bytes() {
  const detail::BufferCache& cache = detail::BufferCache::host();
  return {cache.held_bytes(), cache.idle_bytes()};
}

bool FSDPStrategy::overlaps_backward(const torch::nn::Module& module) const {
  const detail::FSDPState* state = state_of(module);
  STRATA_CHECK(state != nullptr, ConfigError,
               "[fsdp] overlaps_backward: the module was not set up by this strategy; pass what setup_module "
               "returned");
  return state->overlaps_backward();
}

std::vector<FSDPUnitInfo> FSDPStrategy::units() const {
  std::vector<FSDPUnitInfo> out;
  for (const auto& state : states_) {
    for (size_t u : state->units_in_forward_order()) {
      const detail::Unit& unit = state->units()[u];
      FSDPUnitInfo info;
      info.name = unit.name();
      info.shard_numel = unit.shard_numel();
      for (const detail::ShardedParam* p : unit.params()) {
        info.params.push_back(p->name);
        info.numel += p->numel;
      }
      out.push_back(std::move(info));
    }
  }
  return out;
}

at::Tensor FSDPStrategy::full_parameter(const std::string& name) {
  STRATA_CHECK(!states_.empty(), ConfigError, "[fsdp] full_parameter before setup_module");
  const torch::nn::Module* owner = nullptr;
  size_t owners = 0;
  for (const auto& state : states_) {
    if (!state->param(name)) continue;
    if (owner == nullptr) owner = state->root_module().get();
    ++owners;
  }
  STRATA_CHECK(owner != nullptr, ConfigError, "[fsdp] the module set up has no parameter named '", name, "'");
  // Two models built alike (one after another, or a GAN's two halves) share
  // their parameters' names: the name alone would pick one of them.
  STRATA_CHECK(owners == 1, ConfigError, "[fsdp] full_parameter('", name, "'): ", owners,
               " modules set up by this strategy have a parameter of that name; say which with "
               "full_parameter(module, name), the module one that setup_module returned");
  return full_parameter(*owner, name);
}

at::Tensor FSDPStrategy::full_parameter(const torch::nn::Module& module, const std::string& name) {
  detail::FSDPState* state = state_of(module);
  STRATA_CHECK(state != nullptr, ConfigError, "[fsdp] full_parameter got a module that was not set up (",
               module.name(), "); pass one returned by setup_module");
  const detail::ShardedParam* p = state->param(name);
  STRATA_CHECK(p != nullptr, ConfigError, "[fsdp] the module set up has no parameter named '", name, "'");
  return state->gather_full(*p, p->shard);
}

}  // namespace strata::strategies
