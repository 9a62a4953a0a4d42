// FSDPStrategy: units, sharding, gather/free around forward and backward,
// reduce-scatter of gradients.
//
// Note [FSDP parameters]
// Sharding is per parameter (as in PyTorch's FSDP2), so names, optimizer
// param groups and checkpoints keep working by name. For every parameter
// the module keeps two tensors:
// - the *compute* tensor: the module's own tensor (LinearImpl::weight and
//   the like alias it). Its data is swapped with set_data: a 0-element
//   tensor while the unit is idle (so a use outside the unit's forward is
//   a shape error, not a read of freed memory), the full value while the
//   unit computes. After a unit's forward its storage is resized to 0
//   bytes (the views autograd saved keep pointing at that storage), and
//   before its backward the storage is resized back and refilled, so the
//   saved views see the values again.
// - the *shard*: this rank's piece, padded to an equal length on every
//   rank, fp32, a leaf that requires grad. It replaces the compute tensor
//   in the module's parameter dictionary, so module->parameters() lists
//   shards under the original names and the optimizer updates them. The
//   shards of one unit are views of one flat buffer, which is what the
//   unit's all-gather sends.
// The compute tensor's gradient accumulator (created while the tensor is
// full-sized, and kept alive) has a post hook: once every trainable
// parameter of a unit has its gradient, the unit's gradients are packed
// rank-major into one buffer and reduce-scattered (mean) while backward
// goes on; backward() then adds the results to the shards' gradients.
// Reduce-scatters start in a fixed order (the reverse of the forward
// order), so every rank issues the same collectives in the same order.
#include "strata/strategies/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <unordered_map>
#include <unordered_set>

#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/activation_checkpoint.h"
#include "fsdp_impl.h"

namespace strata::strategies {

using checkpoint::shard_chunk;
using checkpoint::shard_slice;

namespace {

// Reaches the parameter dictionary a module keeps (protected in LibTorch),
// to put the shards where module->parameters() finds them.
struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& module) {
    return module.*(&ModuleAccess::parameters_);
  }
};

bool matches(const ModuleTypes& types, const torch::nn::Module& module) {
  return !types.empty() && types.count(module.name()) > 0;
}

// Whether `policy` makes `module` a unit, given the elements of its
// parameters not already in a unit below it.
bool wraps(const AutoWrapPolicy& policy, const torch::nn::Module& module, int64_t nonwrapped_numel) {
  if (auto* types = std::get_if<ModuleTypes>(&policy)) return matches(*types, module);
  if (auto* predicate = std::get_if<WrapPredicate>(&policy)) return (*predicate)(module, false, nonwrapped_numel);
  return false;
}

int64_t numel_of(const torch::nn::Module& module, bool recurse) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters(recurse)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

// Note [Meta-device construction]
// Inside module_init_context(empty_init=true) a model is built on the meta
// device (c10's dispatch-key guard routes every tensor factory there): its
// tensors have shapes and dtypes but no memory, and the layers' own
// initialisation runs as no-ops (LibTorch has no C++ default-device
// context; Python's torch.device("meta") is a TorchFunctionMode).
// setup_module then gives each tensor a real
// value: zeros, sharded, as the weights are to be loaded from a checkpoint.
// set_data refuses to turn a meta tensor into a CPU one, so the tensor's
// dispatch keys are switched to the real device first (leave_meta); the
// Tensor object stays the same, so a layer's typed members (LinearImpl::
// weight) follow.

/// A module tensor's value at setup: itself, or zeros for one built on the
/// meta device.
at::Tensor value_at_setup(const at::Tensor& t) {
  return t.is_meta() ? at::zeros(t.sizes(), t.options().device(at::kCPU).requires_grad(false)) : t.detach();
}

/// Lets a tensor built on the meta device take a value on `device` through
/// set_data (Note [Meta-device construction]).
void leave_meta(at::Tensor& t, c10::Device device) {
  if (t.is_meta()) t.unsafeGetTensorImpl()->_change_backend_component_keys(device);
}

// Creates the gradient accumulator of a module tensor while it holds its
// full value `full` in the compute dtype (autograd checks gradients against
// that shape and dtype; the accumulator must then be kept alive, or the
// hook on it dies with it), then empties the tensor. Null when the tensor
// does not train.
GradAccumulator accumulator_then_empty(at::Tensor& compute, const at::Tensor& full,
                                                             c10::ScalarType dtype, bool trainable) {
  GradAccumulator accumulator;
  leave_meta(compute, full.device());
  compute.mutable_grad() = at::Tensor();
  if (trainable) {
    compute.set_data(full.to(dtype));
    accumulator = torch::autograd::impl::grad_accumulator(compute);
  }
  compute.set_data(at::empty({0}, full.options().dtype(dtype).requires_grad(false)));
  return accumulator;
}

// A tensor over `storage` that does not share `of`'s version counter, so
// writing through it does not invalidate what autograd saved.
at::Tensor alias_storage(const at::Tensor& of) {
  at::Tensor alias = at::empty({0}, of.options().requires_grad(false));
  alias.set_(of.storage(), of.storage_offset(), of.sizes(), of.strides());
  return alias;
}

// Frees (bytes == 0) or refills the storage that a gathered parameter and
// every view autograd saved of it share, on any device: the storage keeps
// its identity and takes new memory from its own allocator (the old bytes
// are not copied; the gather overwrites them).
void resize_storage(const c10::Storage& storage, size_t bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (bytes == 0) {
    impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  } else {
    impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  }
  impl->set_nbytes(bytes);
}

}  // namespace

// ---- the hooks run around a unit's (or checkpointed module's) forward --------

class FSDPForwardHooks : public ForwardHooks {
 public:
  FSDPForwardHooks(std::weak_ptr<FSDPStrategy::Impl> impl, std::optional<size_t> unit, bool checkpoint)
      : impl_(std::move(impl)), unit_(unit), checkpoint_(checkpoint) {}

  at::Tensor run(torch::nn::Module&, const at::Tensor& input, const ForwardBody& body) override {
    std::shared_ptr<FSDPStrategy::Impl> impl = impl_.lock();
    if (!impl) return body(input);
    if (unit_) impl->pre_forward(*unit_);
    at::Tensor output;
    try {
      output = checkpoint_ ? checkpointed_forward(body, input) : body(input);
    } catch (const c10::Error& error) {
      if (unit_ && impl->units[*unit_].root) impl->explain_failed_forward(error);
      throw;
    }
    if (unit_) output = impl->post_forward(*unit_, output);
    return output;
  }

 private:
  std::weak_ptr<FSDPStrategy::Impl> impl_;
  std::optional<size_t> unit_;
  bool checkpoint_;
};

// Runs after the accumulator of a compute tensor added a gradient.
class FSDPGradHook : public torch::autograd::FunctionPostHook {
 public:
  FSDPGradHook(FSDPStrategy::Impl* impl, size_t param) : impl_(impl), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    impl_->on_grad_ready(param_);
    return outputs;
  }

 private:
  FSDPStrategy::Impl* impl_;
  size_t param_;
};

// ---- Impl ----------------------------------------------------------------------

FSDPStrategy::Impl::Impl(comm::Group g, const FSDPOptions& options, c10::ScalarType compute, c10::ScalarType reduce)
    : group(std::move(g)),
      world(group.size()),
      rank(group.rank()),
      compute_dtype(compute),
      reduce_dtype(reduce),
      reshard_after_forward(options.reshard_after_forward),
      prefetch(options.prefetch) {}

at::Tensor FSDPStrategy::Impl::empty_compute(const Param& p) const {
  return at::empty({0}, p.shard.options().dtype(compute_dtype).requires_grad(false));
}

void FSDPStrategy::Impl::issue_gather(size_t u) {
  Unit& unit = units[u];
  if (unit.state == UnitState::kGathered || unit.gather_work) return;
  at::Tensor input = unit.flat_shard.scalar_type() == compute_dtype ? unit.flat_shard
                                                                    : unit.flat_shard.to(compute_dtype);
  unit.gather_input = input;
  unit.gather_output = at::empty({world * unit.shard_numel}, input.options());
  unit.gather_work = group.all_gather_async(input, unit.gather_output);
}

void FSDPStrategy::Impl::ensure_gathered(size_t u) {
  Unit& unit = units[u];
  if (unit.state == UnitState::kGathered) return;
  issue_gather(u);
  unit.gather_work->wait();
  at::Tensor gathered = unit.gather_output.view({world, unit.shard_numel});
  torch::NoGradGuard no_grad;
  for (size_t i : unit.params) {
    Param& p = params[i];
    at::Tensor pieces = gathered.narrow(1, p.offset, p.chunk);  // (world, chunk), rank-major
    if (unit.state == UnitState::kFreed) {
      // Refill the storage autograd's saved views point at.
      at::Tensor& data = p.compute;
      resize_storage(data.storage(), p.storage_bytes);
      at::Tensor padded = alias_storage(data);
      padded.set_(data.storage(), 0, {world, p.chunk}, {p.chunk, 1});
      padded.copy_(pieces);
    } else {
      at::Tensor padded = at::empty({world, p.chunk}, pieces.options());
      padded.copy_(pieces);
      p.storage_bytes = padded.numel() * padded.element_size();
      p.compute.set_data(padded.view({-1}).narrow(0, 0, p.numel).view(p.shape));
    }
  }
  unit.gather_input = at::Tensor();
  unit.gather_output = at::Tensor();
  unit.gather_work.reset();
  unit.state = UnitState::kGathered;
}

void FSDPStrategy::Impl::free_storage(size_t u) {
  Unit& unit = units[u];
  if (unit.state != UnitState::kGathered) return;
  for (size_t i : unit.params) {
    resize_storage(params[i].compute.storage(), 0);
  }
  unit.state = UnitState::kFreed;
}

void FSDPStrategy::Impl::release(size_t u) {
  Unit& unit = units[u];
  if (unit.gather_work) {  // a prefetch nobody used: finish it so the group stays in order
    unit.gather_work->wait();
    unit.gather_work.reset();
    unit.gather_input = at::Tensor();
    unit.gather_output = at::Tensor();
  }
  if (unit.state == UnitState::kIdle) return;
  for (size_t i : unit.params) params[i].compute.set_data(empty_compute(params[i]));
  unit.state = UnitState::kIdle;
}

void FSDPStrategy::Impl::explain_failed_forward(const c10::Error& error) const {
  std::string idle;
  for (const Unit& unit : units) {
    if (unit.entered || unit.params.empty() || unit.state == UnitState::kGathered) continue;
    idle += (idle.empty() ? "" : ", ") + ("'" + unit.name + "' (" + unit.type + ")");
  }
  if (idle.empty()) return;
  std::string what = error.what_without_backtrace();
  throw ConfigError("[fsdp] the forward failed: " + what.substr(0, what.find('\n')) +
                    ". Under FSDP a unit's parameters are empty until its forward starts, through "
                    "strata::hooked_forward (strata/core/module_hooks.h); units whose forward had not started: " +
                    idle + ". If one of them was in use, run its forward through hooked_forward, or choose units "
                    "whose forwards do (a container such as ModuleList has no forward)");
}

std::optional<size_t> FSDPStrategy::Impl::neighbour(size_t u, int direction) const {
  const std::vector<size_t>& order = forward_order.size() >= last_forward_order.size() ? forward_order
                                                                                        : last_forward_order;
  for (size_t k = 0; k < order.size(); ++k) {
    if (order[k] != u) continue;
    int64_t next = static_cast<int64_t>(k) + direction;
    if (next < 0 || next >= static_cast<int64_t>(order.size())) return std::nullopt;
    return order[static_cast<size_t>(next)];
  }
  return std::nullopt;
}

void FSDPStrategy::Impl::pre_forward(size_t u) {
  Unit& unit = units[u];
  if (unit.root) {
    // Reductions started since the last finish(): a backward ran without it.
    STRATA_CHECK(next_reduction == 0, ConfigError,
                 "[fsdp] the previous backward ran through loss.backward() instead of fabric.backward(): its "
                 "gradients were never reduced into the shards. Call fabric.backward(loss) (or "
                 "strategy.backward)");
    forward_order.clear();
    for (Unit& other : units) other.entered = false;
  } else {
    // The units around this one must be computing: their parameters may be
    // used around this forward. One that is not never ran hooked_forward.
    for (std::optional<size_t> a = unit.parent; a; a = units[*a].parent) {
      const Unit& around = units[*a];
      if (around.entered || around.params.empty() || around.state == UnitState::kGathered) continue;
      std::string which = around.root ? "the module passed to setup_module ('" + around.type + "')"
                                      : "unit '" + around.name + "' (" + around.type + ")";
      throw ConfigError("[fsdp] the forward of unit '" + unit.name + "' ran, but the forward of " + which +
                        " around it did not go through strata::hooked_forward, so its parameters were never "
                        "gathered. Run that module's forward through hooked_forward (strata/core/module_hooks.h), "
                        "or choose units whose forwards do (a container such as ModuleList has no forward)");
    }
  }
  ensure_gathered(u);
  if (!unit.entered) forward_order.push_back(u);
  unit.entered = true;
  // Prefetch the unit that ran after this one last time.
  if (prefetch && c10::GradMode::is_enabled()) {
    if (auto next = neighbour(u, +1); next && units[*next].state != UnitState::kGathered) issue_gather(*next);
  }
}

at::Tensor FSDPStrategy::Impl::post_forward(size_t u, const at::Tensor& output) {
  Unit& unit = units[u];
  bool backward_follows = c10::GradMode::is_enabled() && output.requires_grad();
  if (!backward_follows) {
    // No backward will come for this forward (evaluation): free now.
    release(u);
    return output;
  }
  if (!unit.root && reshard_after_forward) free_storage(u);
  // The gradient of the unit's output arrives just before the unit's own
  // backward: gather its parameters again then.
  std::weak_ptr<Impl> weak = weak_from_this();
  at::Tensor out = output;
  out.register_hook([weak, u](const at::Tensor& grad) {
    if (auto impl = weak.lock()) impl->pre_backward(u);
    return grad;
  });
  return out;
}

void FSDPStrategy::Impl::pre_backward(size_t u) {
  ensure_gathered(u);
  if (prefetch) {
    if (auto previous = neighbour(u, -1); previous && units[*previous].state == UnitState::kFreed) {
      issue_gather(*previous);
    }
  }
}

void FSDPStrategy::Impl::on_grad_ready(size_t i) {
  Param& p = params[i];
  if (p.grad_ready) return;
  p.grad_ready = true;
  Unit& unit = units[p.unit];
  if (++unit.ready < unit.trainable) return;
  // Every gradient of the unit is in: its parameters are not needed again
  // in this backward.
  unit.complete = true;
  if (!sync) {
    release(p.unit);
    return;
  }
  launch_ready_reductions();
}

std::vector<size_t> FSDPStrategy::Impl::with_the_rest(std::vector<size_t> order) const {
  std::vector<bool> listed(units.size(), false);
  for (size_t u : order) listed[u] = true;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!listed[u]) order.push_back(u);
  }
  return order;
}

void FSDPStrategy::Impl::launch_ready_reductions() {
  // Reverse forward order: the order backward completes units in.
  if (order_cache.empty()) order_cache = with_the_rest({forward_order.rbegin(), forward_order.rend()});
  while (next_reduction < order_cache.size()) {
    Unit& unit = units[order_cache[next_reduction]];
    if (unit.trainable > 0 && !unit.complete) break;
    if (unit.trainable > 0) launch_reduction(order_cache[next_reduction]);
    ++next_reduction;
  }
}

void FSDPStrategy::Impl::launch_reduction(size_t u) {
  Unit& unit = units[u];
  torch::NoGradGuard no_grad;
  // Rank-major packing: row r holds, for every parameter, the elements of
  // rank r's shard, so the reduce-scatter hands each rank its shards.
  at::Tensor packed = at::zeros({world, unit.shard_numel}, unit.flat_shard.options().dtype(reduce_dtype));
  for (size_t i : unit.params) {
    Param& p = params[i];
    if (!p.trainable) continue;
    at::Tensor grad = p.compute.grad();
    if (!grad.defined()) continue;  // no gradient on this rank in this step: counts as zero
    at::Tensor flat = grad.reshape({-1});
    for (int r = 0; r < world; ++r) {
      checkpoint::FlatSlice slice = shard_slice(p.numel, world, r);
      if (slice.size() == 0) continue;
      packed[r].narrow(0, p.offset, slice.size()).copy_(flat.narrow(0, slice.begin, slice.size()));
    }
    p.compute.mutable_grad() = at::Tensor();
  }
  release(u);
  unit.reduce_input = packed;
  unit.reduce_output = at::empty({unit.shard_numel}, packed.options());
  unit.reduce_work = group.reduce_scatter_async(packed, unit.reduce_output, comm::ReduceOp::kMean);
  // Keep two reductions in flight at most: each holds a unit's full
  // gradients, and holding them all would cost a whole model's worth.
  in_flight.push_back(u);
  while (in_flight.size() > 2) {
    complete_reduction(in_flight.front());
    in_flight.pop_front();
  }
}

void FSDPStrategy::Impl::complete_reduction(size_t u) {
  Unit& unit = units[u];
  unit.reduce_work->wait();
  unit.reduce_work.reset();
  torch::NoGradGuard no_grad;
  at::Tensor reduced = unit.reduce_output.to(unit.flat_shard.scalar_type());
  for (size_t i : unit.params) {
    Param& p = params[i];
    if (!p.trainable) continue;
    at::Tensor piece = reduced.narrow(0, p.offset, p.chunk);
    if (p.shard.grad().defined()) {
      p.shard.mutable_grad().add_(piece);
    } else {
      p.shard.mutable_grad() = piece.clone();
    }
  }
  unit.reduce_input = at::Tensor();
  unit.reduce_output = at::Tensor();
}

void FSDPStrategy::Impl::finish() {
  if (sync) {
    for (Unit& unit : units) unit.complete = true;  // what did not arrive counts as zero
    launch_ready_reductions();
    for (size_t u : in_flight) complete_reduction(u);
    in_flight.clear();
  }
  for (size_t u = 0; u < units.size(); ++u) release(u);
  for (Param& p : params) p.grad_ready = false;
  for (Unit& unit : units) {
    unit.ready = 0;
    unit.complete = false;
  }
  next_reduction = 0;
  order_cache.clear();
  if (!forward_order.empty()) last_forward_order = forward_order;
  forward_order.clear();
}

const FSDPStrategy::Impl::Param* FSDPStrategy::Impl::param_of_state(const std::string& state_name) const {
  size_t dot = state_name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  auto it = param_index.find(state_name.substr(0, dot));
  return it == param_index.end() ? nullptr : &params[it->second];
}

at::Tensor FSDPStrategy::Impl::gather_full(const Param& p, const at::Tensor& piece) {
  at::Tensor gathered = group.all_gather(piece.detach());  // (world, chunk)
  return gathered.reshape({-1}).narrow(0, 0, p.numel).view(p.shape);
}

// ---- building the units ---------------------------------------------------------------

namespace {

// Applies the auto-wrap policy below `module`; returns the number of
// elements not wrapped into a unit. Units are appended bottom-up.
int64_t apply_policy(torch::nn::Module& module, const AutoWrapPolicy& policy, bool is_root,
                     std::vector<torch::nn::Module*>& units) {
  int64_t total = numel_of(module, true);
  bool descend = true;
  if (std::holds_alternative<std::monostate>(policy)) descend = false;
  if (auto* predicate = std::get_if<WrapPredicate>(&policy); predicate && !is_root) {
    descend = (*predicate)(module, true, total);
  }
  if (!descend) return total;
  int64_t nonwrapped = numel_of(module, false);
  for (const auto& child : module.children()) nonwrapped += apply_policy(*child, policy, false, units);
  if (is_root || !wraps(policy, module, nonwrapped)) return nonwrapped;
  units.push_back(&module);
  return 0;
}

struct Occurrence {
  size_t unit;
  torch::nn::Module* owner;
  std::string local_name;
  std::string full_name;
};

// Walks the module tree below `module` (inside unit `unit`, at path
// `prefix`): every parameter with where it is registered, and the nearest
// unit around each unit.
void collect(torch::nn::Module& module, const std::string& prefix, size_t unit,
             const std::unordered_map<const torch::nn::Module*, size_t>& unit_of,
             std::vector<std::pair<at::Tensor, std::vector<Occurrence>>>& found,
             std::unordered_map<const c10::TensorImpl*, size_t>& index,
             std::vector<std::optional<size_t>>& parents) {
  auto it = unit_of.find(&module);
  if (it != unit_of.end()) {
    if (it->second != unit) parents[it->second] = unit;
    unit = it->second;
  }
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const at::Tensor& tensor = item.value();
    Occurrence occurrence{unit, &module, item.key(), prefix.empty() ? item.key() : prefix + "." + item.key()};
    auto [slot, inserted] = index.emplace(tensor.unsafeGetTensorImpl(), found.size());
    if (inserted) found.push_back({tensor, {}});
    found[slot->second].second.push_back(std::move(occurrence));
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix.empty() ? child.key() : prefix + "." + child.key(), unit, unit_of, found, index,
            parents);
  }
}

}  // namespace

void FSDPStrategy::Impl::build(torch::nn::Module& root_module, const FSDPOptions& options,
                               const Presharded* presharded) {
  std::vector<torch::nn::Module*> unit_modules;
  apply_policy(root_module, options.auto_wrap_policy, true, unit_modules);
  unit_modules.push_back(&root_module);
  std::unordered_map<const torch::nn::Module*, size_t> unit_of;
  units.resize(unit_modules.size());
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    units[u].module = unit_modules[u];
    units[u].type = unit_modules[u]->name();
    unit_of[unit_modules[u]] = u;
  }
  root = unit_modules.size() - 1;
  units[root].root = true;
  // Unit paths, for reports.
  for (const auto& item : root_module.named_modules("", /*include_self=*/false)) {
    auto it = unit_of.find(item.value().get());
    if (it != unit_of.end()) units[it->second].name = item.key();
  }

  std::vector<std::pair<at::Tensor, std::vector<Occurrence>>> found;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  std::vector<std::optional<size_t>> parents(units.size());
  collect(root_module, "", root, unit_of, found, index, parents);
  for (size_t u = 0; u < units.size(); ++u) units[u].parent = parents[u];

  torch::NoGradGuard no_grad;
  for (auto& [tensor, occurrences] : found) {
    // A parameter registered in two units (tied weights) belongs to the
    // root, so it is sharded once and gathered while the root computes.
    size_t unit = occurrences.front().unit;
    for (const Occurrence& o : occurrences) {
      if (o.unit != unit) unit = root;
    }
    Param p;
    p.name = occurrences.front().full_name;
    p.compute = tensor;
    p.shape = tensor.sizes().vec();
    p.trainable = tensor.requires_grad();
    if (presharded) {
      auto it = presharded->by_shard.find(tensor.unsafeGetTensorImpl());
      if (it != presharded->by_shard.end()) {
        p.preshard = tensor;
        p.compute = it->second.compute;
        p.shape = it->second.shape;
        p.trainable = it->second.trainable;
        p.accumulator = it->second.accumulator;
      }
    }
    p.numel = c10::multiply_integers(p.shape);
    p.chunk = shard_chunk(p.numel, world);
    p.unit = unit;
    for (const Occurrence& o : occurrences) p.owners.emplace_back(o.owner, o.local_name);
    units[unit].params.push_back(params.size());
    param_index[p.name] = params.size();
    params.push_back(std::move(p));
  }

  found.clear();  // the last handles to pieces sharded at construction, besides the params'

  // Unit by unit, so that at most one unit's pieces exist twice.
  for (Unit& unit : units) {
    int64_t offset = 0;
    for (size_t i : unit.params) {
      params[i].offset = offset;
      offset += params[i].chunk;
      if (params[i].trainable) ++unit.trainable;
    }
    unit.shard_numel = offset;
    unit.flat_shard = at::zeros({offset}, at::TensorOptions().dtype(at::kFloat));
    for (size_t i : unit.params) shard_param(i, options);
  }
  for (at::Tensor buffer : root_module.buffers()) {
    if (!buffer.is_meta()) continue;
    at::Tensor value = value_at_setup(buffer);
    leave_meta(buffer, value.device());
    buffer.set_data(value);
  }
  if (options.sync_module_states && world > 1) {
    for (at::Tensor buffer : root_module.buffers()) group.broadcast(buffer, 0);
  }
}

void FSDPStrategy::Impl::shard_param(size_t i, const FSDPOptions& options) {
  Param& p = params[i];
  Unit& unit = units[p.unit];
  if (p.preshard.defined()) {
    // Sharded while the model was built: move the piece into the unit.
    unit.flat_shard.narrow(0, p.offset, p.chunk).copy_(p.preshard.detach());
    p.preshard = at::Tensor();
    p.shard = unit.flat_shard.narrow(0, p.offset, p.chunk).detach().requires_grad_(p.trainable);
    if (p.accumulator) p.hook_key = p.accumulator->add_post_hook(std::make_unique<FSDPGradHook>(this, i));
    for (auto& [owner, local_name] : p.owners) ModuleAccess::parameters_of(*owner)[local_name] = p.shard;
    return;
  }
  at::Tensor full = value_at_setup(p.compute);
  if (options.sync_module_states && world > 1) {
    full = full.clone().contiguous();
    group.broadcast(full, 0);
  }
  at::Tensor mine = checkpoint::shard_of(full, world, rank);
  unit.flat_shard.narrow(0, p.offset, mine.numel()).copy_(mine);
  p.shard = unit.flat_shard.narrow(0, p.offset, p.chunk).detach().requires_grad_(p.trainable);
  p.accumulator = accumulator_then_empty(p.compute, full, compute_dtype, p.trainable);
  if (p.accumulator) p.hook_key = p.accumulator->add_post_hook(std::make_unique<FSDPGradHook>(this, i));
  for (auto& [owner, local_name] : p.owners) ModuleAccess::parameters_of(*owner)[local_name] = p.shard;
}

void FSDPStrategy::Impl::unhook() {
  for (Unit& unit : units) set_forward_hooks(*unit.module, nullptr);
  for (torch::nn::Module* module : checkpointed) set_forward_hooks(*module, nullptr);
  for (Param& p : params) {
    if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
    p.accumulator.reset();
  }
}

// ---- FSDPStrategy -------------------------------------------------------------------------

FSDPStrategy::FSDPStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision,
                           FSDPOptions options)
    : Strategy(std::move(accelerator), std::move(precision)), options_(std::move(options)) {
  STRATA_CHECK(options_.state_dict_type == "full" || options_.state_dict_type == "sharded", ConfigError,
               "[fsdp] state_dict_type must be 'full' or 'sharded', got '", options_.state_dict_type, "'");
  STRATA_CHECK(options_.checkpoint_io.is_null() || options_.checkpoint_io.empty(), ConfigError,
               "[fsdp] checkpoint_io plugins are not supported; leave checkpoint_io empty");
  c10::ScalarType compute = options_.compute_dtype.value_or(precision_.compute_dtype());
  STRATA_CHECK(compute == c10::kFloat || compute == c10::kBFloat16 || compute == c10::kHalf, ConfigError,
               "[fsdp] compute_dtype must be float32, bfloat16 or float16, got ", compute);
  STRATA_CHECK(compute == c10::kFloat || precision_.autocast(), ConfigError, "[fsdp] compute_dtype ", compute,
               " needs a mixed precision (e.g. 'bf16-mixed') so that inputs are cast too; precision is '",
               precision_.name(), "'");
}

FSDPStrategy::~FSDPStrategy() {
  if (impl_) impl_->unhook();
}

void FSDPStrategy::setup_environment() {
  Strategy::setup_environment();
  check_parallel_devices(options_.parallel_devices);
  group_.set_debug(options_.debug);
}

ModulePtr FSDPStrategy::setup_module(ModulePtr module) {
  STRATA_CHECK(module != nullptr, ConfigError, "[fsdp] setup_module got a null module");
  if (impl_) {
    STRATA_CHECK(impl_->root_module.get() == module.get(), ConfigError,
                 "[fsdp] setup_module was already called with another module; FSDP trains one module per strategy");
    if (is_global_zero()) {
      std::cerr << "[fsdp] warning: the module is already sharded; setup_module returns it as it is and does not "
                   "apply the policies again\n";
    }
    return module;
  }
  modules_.push_back(module);
  c10::ScalarType compute = options_.compute_dtype.value_or(precision_.compute_dtype());
  impl_ = std::make_shared<Impl>(group_, options_, compute, options_.reduce_dtype.value_or(compute));
  impl_->root_module = module;
  impl_->build(*module, options_, presharded_.get());
  presharded_.reset();
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    torch::nn::Module& unit_module = *impl_->units[u].module;
    bool checkpoint = matches(options_.activation_checkpointing_policy, unit_module);
    set_forward_hooks(unit_module, std::make_shared<FSDPForwardHooks>(impl_, u, checkpoint));
  }
  // Activation checkpointing applies to every instance of the listed types,
  // units or not.
  for (const auto& item : module->named_modules("", /*include_self=*/true)) {
    torch::nn::Module* m = item.value().get();
    if (!matches(options_.activation_checkpointing_policy, *m)) continue;
    bool is_unit = false;
    for (const auto& unit : impl_->units) is_unit = is_unit || unit.module == m;
    if (is_unit) continue;
    set_forward_hooks(*m, std::make_shared<FSDPForwardHooks>(impl_, std::nullopt, true));
    impl_->checkpointed.push_back(m);
  }
  return module;
}

void FSDPStrategy::setup_optimizer(torch::optim::Optimizer& optimizer) {
  STRATA_CHECK(impl_ != nullptr, ConfigError,
               "[fsdp] setup_optimizer before setup_module: call setup_module(model) first, then build the optimizer "
               "from model->parameters() (the sharded parameters), then setup_optimizer");
  std::unordered_set<const c10::TensorImpl*> shards;
  for (const auto& p : impl_->params) shards.insert(p.shard.unsafeGetTensorImpl());
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
  // Note [Meta-device construction]. The example models also skip their own
  // initialisation (it would be a no-op on meta tensors anyway).
  struct Guards {
    c10::impl::IncludeDispatchKeyGuard meta{c10::DispatchKey::Meta};
    // Factories (empty, ones, ...) pick their kernel by their device
    // argument in BackendSelect; without it they reach the meta kernels.
    c10::impl::ExcludeDispatchKeyGuard no_backend_select{c10::DispatchKey::BackendSelect};
    SkipParameterInit skip;
  };
  auto guards = std::make_shared<Guards>();
  return Scope([guards]() mutable { guards.reset(); });
}

Scope FSDPStrategy::module_sharded_context() {
  STRATA_CHECK(launched(), ConfigError,
               "[fsdp] module_sharded_context needs the process group: call it inside fabric.launch (after "
               "setup_environment)");
  STRATA_CHECK(impl_ == nullptr, ConfigError, "[fsdp] module_sharded_context after setup_module: build the model "
               "inside the context first, then call setup_module");
  if (!presharded_) presharded_ = std::make_shared<Presharded>();
  std::shared_ptr<Presharded> presharded = presharded_;
  const AutoWrapPolicy policy = options_.auto_wrap_policy;
  const int world = world_size(), rank = global_rank();
  const c10::ScalarType compute = options_.compute_dtype.value_or(precision_.compute_dtype());
  // Shards a complete unit on the spot: each parameter keeps only this
  // rank's piece; setup_module later adopts the pieces.
  auto shard_unit = [presharded, policy, world, rank, compute](torch::nn::Module& module) {
    if (!wraps(policy, module, numel_of(module, true))) return;
    torch::NoGradGuard no_grad;
    // Inside module_init_context(empty_init) the model is built on the meta
    // device; the shards made here are real memory all the same.
    c10::impl::ForceDispatchKeyGuard real_tensors(c10::default_included_set, c10::default_excluded_set);
    std::unordered_map<const c10::TensorImpl*, at::Tensor> done;
    for (const auto& item : module.named_modules("", /*include_self=*/true)) {
      torch::nn::Module& owner = *item.value();
      for (const auto& param : owner.named_parameters(/*recurse=*/false)) {
        at::Tensor tensor = param.value();
        const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
        if (presharded->by_shard.count(impl)) continue;  // a unit inside, sharded already
        auto it = done.find(impl);
        if (it == done.end()) {
          Presharded::Entry entry;
          entry.compute = tensor;
          entry.shape = tensor.sizes().vec();
          entry.trainable = tensor.requires_grad();
          at::Tensor full = value_at_setup(tensor);
          at::Tensor mine = checkpoint::shard_of(full, world, rank);
          at::Tensor shard = at::zeros({shard_chunk(full.numel(), world)}, at::kFloat);
          shard.narrow(0, 0, mine.numel()).copy_(mine);
          shard.requires_grad_(entry.trainable);
          entry.accumulator = accumulator_then_empty(tensor, full, compute, entry.trainable);
          presharded->by_shard.emplace(shard.unsafeGetTensorImpl(), std::move(entry));
          it = done.emplace(impl, shard).first;
        }
        ModuleAccess::parameters_of(owner)[param.key()] = it->second;
      }
    }
  };
  ModuleBuiltHandler previous = set_module_built_handler(shard_unit);
  return Scope([previous]() mutable { set_module_built_handler(std::move(previous)); });
}

void FSDPStrategy::backward(const at::Tensor& loss) {
  Strategy::backward(loss);
  if (!impl_) return;
  impl_->finish();
  ++impl_->step;
  if (options_.debug) {
    comm::CommStats stats = group_.stats();
    if (is_global_zero()) std::cerr << "[fsdp] step " << impl_->step << " communication: " << stats.summary() << "\n";
    group_.reset_stats();
  }
}

Scope FSDPStrategy::no_backward_sync(torch::nn::Module& module, bool enabled) {
  require_set_up(module, "no_backward_sync");
  if (!enabled || !impl_) return Scope();
  std::shared_ptr<Impl> impl = impl_;
  bool previous = impl->sync;
  impl->sync = false;
  return Scope([impl, previous] { impl->sync = previous; });
}

at::Tensor FSDPStrategy::reduce_norm(const at::Tensor& local, bool is_max) {
  at::Tensor total = local.clone();
  group_.all_reduce(total, is_max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum);
  return total;
}

void FSDPStrategy::teardown() {
  if (impl_) {
    for (size_t u = 0; u < impl_->units.size(); ++u) impl_->release(u);
    impl_->unhook();
  }
  Strategy::teardown();
  impl_.reset();
}

std::vector<FSDPUnitInfo> FSDPStrategy::units() const {
  std::vector<FSDPUnitInfo> out;
  if (!impl_) return out;
  for (size_t u : impl_->with_the_rest(impl_->last_forward_order)) {
    const Impl::Unit& unit = impl_->units[u];
    FSDPUnitInfo info;
    info.name = unit.name;
    info.shard_numel = unit.shard_numel;
    for (size_t i : unit.params) {
      info.params.push_back(impl_->params[i].name);
      info.numel += impl_->params[i].numel;
    }
    out.push_back(std::move(info));
  }
  return out;
}

at::Tensor FSDPStrategy::full_parameter(const std::string& name) {
  STRATA_CHECK(impl_ != nullptr, ConfigError, "[fsdp] full_parameter before setup_module");
  auto it = impl_->param_index.find(name);
  STRATA_CHECK(it != impl_->param_index.end(), ConfigError, "[fsdp] the module set up has no parameter named '",
               name, "'");
  const Impl::Param& p = impl_->params[it->second];
  return impl_->gather_full(p, p.shard);
}

}  // namespace strata::strategies
