// Fabric: the placement and launch (Note [One launch protocol] in
// strategies/placement.h), and thin forwarding to the strategy.
#include "strata/fabric/fabric.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "strata/core/error.h"

namespace strata {

Fabric::Fabric(FabricOptions options)
    : options_(std::move(options)), placement_(strategies::resolve_placement(options_, "fabric")) {
  options_.devices = placement_.devices;
  strategy_ = placement_.strategy;
}

Fabric::~Fabric() = default;

nlohmann::json Fabric::run_launch(const std::function<nlohmann::json()>& call) {
  STRATA_CHECK(!launch_called_, ConfigError,
               "[fabric] launch() was already called on this Fabric; state from the first run would be lost. "
               "Create a new Fabric for a second run");
  launch_called_ = true;
  return strategies::launch(placement_, "fabric", strategies::WorkerExit::kAfterCall, call);
}

strategies::ModulePtr Fabric::setup_module(strategies::ModulePtr module) {
  strategies::ModulePtr set_up = strategy().setup_module(std::move(module));
  if (set_up) strategy().apply_sync_batchnorm(*set_up);
  return set_up;
}

strategies::ModulePtr Fabric::borrow(torch::nn::Module& module) {
  return strategies::module_pointer(module);
}

strategies::ModulePtr Fabric::setup(strategies::ModulePtr module,
                                    const std::vector<torch::optim::Optimizer*>& optimizers) {
  strategies::ModulePtr set_up = strategy().setup_module_and_optimizers(std::move(module), optimizers);
  if (set_up) strategy().apply_sync_batchnorm(*set_up);
  return set_up;
}

strategies::Scope Fabric::init_module(std::optional<bool> empty_init) {
  return strategy().module_init_context(empty_init);
}

void Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) { strategy().setup_optimizer(optimizer); }

void Fabric::setup_optimizers(const std::vector<torch::optim::Optimizer*>& optimizers) {
  for (torch::optim::Optimizer* optimizer : optimizers) strategy().setup_optimizer(*optimizer);
}

std::shared_ptr<data::Loader> Fabric::setup_dataloader(std::shared_ptr<data::Loader> loader) {
  return strategy().process_dataloader(std::move(loader));
}

std::shared_ptr<data::Loader> Fabric::setup_dataloader(std::shared_ptr<const data::Dataset> dataset,
                                                       const data::DataOptions& options) {
  return setup_dataloader(data::make_distributed_loader(std::move(dataset), options, world_size(), global_rank()));
}

std::vector<std::shared_ptr<data::Loader>> Fabric::setup_dataloaders(
    const std::vector<std::shared_ptr<data::Loader>>& loaders) {
  std::vector<std::shared_ptr<data::Loader>> out;
  for (const auto& loader : loaders) out.push_back(setup_dataloader(loader));
  return out;
}

void Fabric::backward(const at::Tensor& loss) { strategy().backward(loss); }

at::Tensor Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                  std::optional<double> max_norm, std::optional<double> clip_val, double norm_type,
                                  bool error_if_nonfinite) {
  STRATA_CHECK(max_norm.has_value() != clip_val.has_value(), ConfigError,
               "[fabric] clip_gradients needs exactly one of max_norm and clip_val");
  if (clip_val) {
    strategy().clip_gradients_value(module, optimizer, *clip_val);
    return at::Tensor();
  }
  return strategy().clip_gradients_norm(module, optimizer, *max_norm, norm_type, error_if_nonfinite);
}

at::Tensor Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                  const ClipByNorm& clip) {
  return clip_gradients(module, optimizer, clip.max_norm, std::nullopt, clip.norm_type, clip.error_if_nonfinite);
}

void Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const ClipByValue& clip) {
  clip_gradients(module, optimizer, std::nullopt, clip.value);
}

strategies::Scope Fabric::no_backward_sync(torch::nn::Module& module, bool enabled) {
  return strategy().no_backward_sync(module, enabled);
}

strategies::Precision::ForwardContext Fabric::autocast() const {
  return strategies::Precision::ForwardContext(strategy().precision());
}

at::Tensor Fabric::all_gather(const at::Tensor& tensor, bool sync_grads) {
  return strategy().all_gather(tensor, sync_grads);
}
at::Tensor Fabric::all_reduce(const at::Tensor& tensor, comm::ReduceOp op) { return strategy().all_reduce(tensor, op); }
at::Tensor Fabric::all_reduce(const at::Tensor& tensor, const std::string& op) {
  return strategy().all_reduce(tensor, op);
}
at::Tensor Fabric::broadcast(const at::Tensor& tensor, int src) { return strategy().broadcast(tensor, src); }
void Fabric::barrier(const std::string& name) { strategy().barrier(name); }

// Collections: one collective per element, in the vector's order or the
// map's (sorted) key order, the same on every rank.
std::vector<at::Tensor> Fabric::all_gather(const std::vector<at::Tensor>& tensors, bool sync_grads) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(all_gather(t, sync_grads));
  return out;
}

std::map<std::string, at::Tensor> Fabric::all_gather(const std::map<std::string, at::Tensor>& tensors,
                                                     bool sync_grads) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, t] : tensors) out[key] = all_gather(t, sync_grads);
  return out;
}

std::vector<at::Tensor> Fabric::all_reduce(const std::vector<at::Tensor>& tensors, comm::ReduceOp op) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(all_reduce(t, op));
  return out;
}

std::map<std::string, at::Tensor> Fabric::all_reduce(const std::map<std::string, at::Tensor>& tensors,
                                                     comm::ReduceOp op) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, t] : tensors) out[key] = all_reduce(t, op);
  return out;
}

std::vector<at::Tensor> Fabric::broadcast(const std::vector<at::Tensor>& tensors, int src) {
  // The source's element count first, so other ranks may pass anything.
  const size_t count = broadcast(static_cast<uint64_t>(tensors.size()), src);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < count; ++i) out.push_back(broadcast(i < tensors.size() ? tensors[i] : at::Tensor(), src));
  return out;
}

std::map<std::string, at::Tensor> Fabric::broadcast(const std::map<std::string, at::Tensor>& tensors, int src) {
  std::vector<std::string> keys;
  for (const auto& item : tensors) keys.push_back(item.first);
  keys = broadcast(keys, src);
  std::map<std::string, at::Tensor> out;
  for (const std::string& key : keys) {
    auto it = tensors.find(key);
    out[key] = broadcast(it == tensors.end() ? at::Tensor() : it->second, src);
  }
  return out;
}

void Fabric::save(const std::string& path, const strategies::State& state, const strategies::StateFilter& filter) {
  strategy().save_checkpoint(path, state, nullptr, filter);
}

void Fabric::load_raw(const std::string& path, torch::nn::Module& module, bool strict) {
  strategy().load_raw(path, module, strict);
}

void Fabric::load_raw(const std::string& path, torch::optim::Optimizer& optimizer, bool strict) {
  strategy().load_raw(path, optimizer, strict);
}

nlohmann::json Fabric::load(const std::string& path, strategies::State& state, bool strict) {
  return strategy().load_checkpoint(path, state, strict);
}

void Fabric::seed_everything(uint64_t seed) { strategies::seed_everything(seed); }

}  // namespace strata
