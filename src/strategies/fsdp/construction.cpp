// Sharded construction: the units of a model, its parameters sharded into
// them (at setup_module, or while the model is built inside
// module_sharded_context), and the meta device of empty_init.
//
// Note [Meta-device construction]
// Inside module_init_context(empty_init=true) a model is built on the meta
// device (c10's dispatch-key guard routes every tensor factory there): its
// tensors have shapes and dtypes but no memory, and the layers' own
// initialisation runs as no-ops (LibTorch has no C++ default-device
// context; Python's torch.device("meta") is a TorchFunctionMode).
// setup_module then gives each tensor a real value: zeros, sharded, as the
// weights are to be loaded from a checkpoint. set_data refuses to turn a
// meta tensor into a CPU one, so the tensor's dispatch keys are switched
// to the real device first (leave_meta); the Tensor object stays the same,
// so a layer's typed members (LinearImpl::weight) follow.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <unordered_set>

#include "construction.h"
#include "first_use.h"
#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"
#include "wrap_policy.h"

namespace strata::strategies::detail {
namespace {

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

// "'layers.3.fc.weight' (of 'layers.3.fc', torch::nn::LinearImpl)": where
// a parameter sits and what holds it, for errors.
std::string describe(const Occurrence& o) {
  std::string module = o.full_name.rfind('.') == std::string::npos ? std::string("the root module")
                                                                  : "'" + o.full_name.substr(0, o.full_name.rfind('.')) + "'";
  return "'" + o.full_name + "' (of " + module + ", " + o.owner->name() + ")";
}

// What FSDP cannot shard is refused before anything changes, naming the
// parameter and the module by their paths.
void refuse_unshardable(const std::vector<std::pair<at::Tensor, std::vector<Occurrence>>>& found,
                        const std::unordered_set<const c10::TensorImpl*>& sharded_elsewhere) {
  std::unordered_map<const c10::StorageImpl*, const Occurrence*> storages;
  for (const auto& [tensor, occurrences] : found) {
    const Occurrence& o = occurrences.front();
    // Its compute tensor, or its shard (the two modules share the layer).
    const bool sharded = tensor.unsafeGetTensorImpl()->key_set().has(kFirstUseKey) ||
                         sharded_elsewhere.count(tensor.unsafeGetTensorImpl()) > 0;
    STRATA_CHECK(!sharded, ConfigError, "[fsdp] parameter ",
                 describe(o), " is sharded already by another module set up with this strategy: the two modules "
                 "share it, and FSDP shards a tensor once. Put both under one module and set up that one, or give "
                 "each its own tensor");
    STRATA_CHECK(tensor.layout() == c10::kStrided && !tensor.is_quantized() && tensor.has_storage(), ConfigError,
                 "[fsdp] parameter ", describe(o), " is a ", tensor.layout(), tensor.is_quantized() ? " quantized" : "",
                 " tensor: FSDP shards dense tensors only. Keep that module out of the module passed to setup_module");
    if (tensor.is_meta() || tensor.numel() == 0) continue;
    auto [it, inserted] = storages.emplace(tensor.storage().unsafeGetStorageImpl(), &o);
    STRATA_CHECK(inserted, ConfigError, "[fsdp] parameters ", describe(*it->second), " and ", describe(o),
                 " share memory (one is a view of the other, or both of one tensor): FSDP shards each parameter on its "
                 "own, which would untie them. Register the same tensor in both places (tied weights are sharded "
                 "once), or make each a tensor of its own (.clone())");
  }
}

}  // namespace

FSDPState::FSDPState(ModulePtr root_module, comm::Group group, const FSDPOptions& options,
                     c10::ScalarType compute, c10::ScalarType reduce, c10::Device device)
    : context_{std::move(group), 1, compute, reduce, options.reshard_after_forward},
      rank_(context_.group.rank()),
      prefetch_(options.prefetch),
      overlap_backward_(options.overlap_backward.value_or(!device.is_cpu())),
      root_module_(std::move(root_module)),
      grad_hooks_([this](size_t i) { return post_backward(i); }) {
  context_.world = context_.group.size();
  // Note [Modules held by value]: the units below the root outlive it.
  if (borrowed(root_module_)) root_children_ = root_module_->children();
}

void FSDPState::watch_root() {
  if (borrowed(root_module_)) root_life_ = forward_hooks_holder(*root_module_);
}

void FSDPState::build(const FSDPOptions& options, Presharded* presharded,
                      const std::unordered_set<const c10::TensorImpl*>& sharded_elsewhere) {
  torch::nn::Module& root_module = *root_module_;
  std::vector<torch::nn::Module*> modules = unit_modules(root_module, options.auto_wrap_policy);
  for (size_t u = 0; u < modules.size(); ++u) unit_index_[modules[u]] = u;
  root_ = modules.size() - 1;
  hooked_.assign(modules.size(), 0);
  enable_first_use();
  // Unit paths, for reports.
  std::vector<std::string> names(modules.size());
  for (const auto& item : root_module.named_modules("", /*include_self=*/false)) {
    auto it = unit_index_.find(item.value().get());
    if (it != unit_index_.end()) names[it->second] = item.key();
  }

  std::vector<std::pair<at::Tensor, std::vector<Occurrence>>> found;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  std::vector<std::optional<size_t>> parents(modules.size());
  collect(root_module, "", root_, unit_index_, found, index, parents);
  refuse_unshardable(found, sharded_elsewhere);

  const int world = context_.world;
  std::vector<std::vector<size_t>> members(modules.size());  // each unit's parameters, by index
  torch::NoGradGuard no_grad;
  for (auto& [tensor, occurrences] : found) {
    // A parameter registered in two units (tied weights) belongs to the
    // root, so it is sharded once and gathered while the root computes.
    size_t unit = occurrences.front().unit;
    for (const Occurrence& o : occurrences) {
      if (o.unit != unit) unit = root_;
    }
    ShardedParam p;
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
        // Adopted: the entry goes (its key is an address, which a tensor
        // made later may reuse once this piece is freed).
        presharded->by_shard.erase(it);
      }
    }
    p.tag = std::make_shared<const FirstUseTag>(FirstUseTag{weak_from_this(), params_.size(), p.name});
    p.numel = c10::multiply_integers(p.shape);
    p.chunk = checkpoint::shard_chunk(p.numel, world);
    p.unit = unit;
    for (const Occurrence& o : occurrences) p.owners.emplace_back(o.owner, o.local_name);
    members[unit].push_back(params_.size());
    param_index_[p.name] = params_.size();
    params_.push_back(std::move(p));
  }

  found.clear();  // the last handles to pieces sharded at construction, besides the params'

  // Unit by unit, so that at most one unit's pieces exist twice. params_
  // is complete: the units' pointers into it stay valid.
  units_.reserve(modules.size());
  for (size_t u = 0; u < modules.size(); ++u) {
    std::vector<ShardedParam*> unit_params;
    for (size_t i : members[u]) unit_params.push_back(&params_[i]);
    units_.emplace_back(context_, *modules[u], names[u], u == root_, parents[u], std::move(unit_params));
    for (size_t i : members[u]) shard_param(i, options);
  }
  for (at::Tensor buffer : root_module.buffers()) {
    if (!buffer.is_meta()) continue;
    at::Tensor value = value_at_setup(buffer);
    leave_meta(buffer, value.device());
    buffer.set_data(value);
  }
  if (options.sync_module_states && world > 1) {
    for (at::Tensor buffer : root_module.buffers()) context_.group.broadcast(buffer, 0);
  }
}

void FSDPState::shard_param(size_t i, const FSDPOptions& options) {
  ShardedParam& p = params_[i];
  const Unit& unit = units_[p.unit];
  if (p.preshard.defined()) {
    // Sharded while the model was built: move the piece into the unit.
    unit.shard_view(p).copy_(p.preshard.detach());
    p.preshard = at::Tensor();
    p.shard = unit.shard_view(p).detach().requires_grad_(p.trainable);
    grad_hooks_.add(std::move(p.accumulator), i);
    p.install_shard();
    return;
  }
  at::Tensor full = value_at_setup(p.compute);
  if (options.sync_module_states && context_.world > 1) {
    full = full.clone().contiguous();
    context_.group.broadcast(full, 0);
  }
  at::Tensor mine = checkpoint::shard_of(full, context_.world, rank_);
  unit.shard_view(p).narrow(0, 0, mine.numel()).copy_(mine);
  p.shard = unit.shard_view(p).detach().requires_grad_(p.trainable);
  grad_hooks_.add(accumulator_then_empty(p.compute, full, context_.compute_dtype, p.trainable), i);
  p.install_shard();
}

void FSDPState::place_shards(c10::Device device) {
  for (Unit& unit : units_) unit.move_shards_to(device);
  // The compute tensors keep their full shapes over empty storages there.
  for (ShardedParam& p : params_) p.reshard(context_.compute_dtype);
}

void FSDPState::unhook() {
  // A root held by value and gone took its hooks with it.
  const bool root_gone = !root_alive();
  for (Unit& unit : units_) {
    if (!(root_gone && unit.is_root())) set_forward_hooks(unit.module(), nullptr);
  }
  for (torch::nn::Module* module : checkpointed_) {
    if (!(root_gone && module == root_module_.get())) set_forward_hooks(*module, nullptr);
  }
  grad_hooks_.remove_all();
}

ModuleBuiltHandler shard_when_built(std::shared_ptr<Presharded> presharded, AutoWrapPolicy policy, int world,
                                    int rank, c10::ScalarType compute) {
  // Shards a complete unit on the spot: each parameter keeps only this
  // rank's piece; setup_module later adopts the pieces.
  return [presharded, policy, world, rank, compute](torch::nn::Module& module) {
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
          at::Tensor shard = at::zeros({checkpoint::shard_chunk(full.numel(), world)}, at::kFloat);
          shard.narrow(0, 0, mine.numel()).copy_(mine);
          shard.requires_grad_(entry.trainable);
          entry.accumulator = accumulator_then_empty(tensor, full, compute, entry.trainable);
          presharded->by_shard.emplace(shard.unsafeGetTensorImpl(), std::move(entry));
          it = done.emplace(impl, shard).first;
        }
        parameters_of(owner)[param.key()] = it->second;
      }
    }
  };
}

}  // namespace strata::strategies::detail
