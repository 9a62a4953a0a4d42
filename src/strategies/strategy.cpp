// The Strategy base: environment, placement, the plain training step,
// gradient clipping and the collectives every strategy shares.
#include "strata/strategies/strategy.h"

#include <ATen/ATen.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <filesystem>

#include "strata/core/error.h"
#include "strata/strategies/placement.h"
#include "strata/core/log.h"
#include "strata/core/module_hooks.h"
#include "strata/data/device_loader.h"
#include "strata/runtime/process.h"
#include "sync_batchnorm.h"

namespace strata::strategies {
namespace {

// Note [Differentiable all_gather]
// Every rank's loss may depend on every rank's slice; the total loss is
// the sum over ranks, so the gradient of rank r's input is the sum over
// ranks of their output gradients at index r: all-reduce(sum) the output
// gradient, then keep row r.
struct AllGatherFunction : public torch::autograd::Function<AllGatherFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, comm::Group* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return group->all_gather(input);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // Every rank's gradient of the gathered rows, summed, and this rank's
    // row of the sum: a reduce_scatter, which also keeps a lazy device's
    // step free of a slice at this rank's offset (the replicas' steps must
    // be one program).
    auto* group = reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    at::Tensor mine = group->reduce_scatter(grads[0].contiguous(), comm::ReduceOp::kSum);
    return {mine.select(0, 0), at::Tensor()};
  }
};

std::vector<at::Tensor> grads_of(torch::nn::Module& module) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : module.parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

Strategy::Strategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision)
    : accelerator_(accelerator ? std::move(accelerator) : cpu_accelerator()),
      precision_(precision ? *precision : Precision::parse("32-true", accelerator_->name())) {}

Strategy::~Strategy() { detail::release_sync_batchnorm(this); }

std::shared_ptr<Strategy> Strategy::replica() const {
  throw ConfigError("[" + name() + "] runs one rank per process; it cannot run ranks as threads (the '" +
                    accelerator_->name() + "' accelerator asks for it: use its own strategy)");
}

void Strategy::setup_environment() {
  if (launched_) return;
  if (const detail::ThreadRank* rank = detail::current_thread_rank()) {
    // Note [Ranks as threads] (strategies/xla.h)
    env_ = rank->env;
    set_current_device(accelerator_->device(env_.local_rank));
    group_ = comm::Group(rank->backend, comm::GroupOptions().with_timeout(collective_timeout_));
    launched_ = true;
    return;
  }
  env_ = runtime::Environment::from_env();
  runtime::apply_allocator_settings();
  log::set_rank(env_.rank);
  runtime::apply_worker_threads(env_);  // Note [Threads under other launchers] (process.cpp)
  if (accelerator_->name() == "cpu" && precision_.compute_dtype() == c10::kBFloat16 && !cpu_has_native_bf16()) {
    log::warning("[precision] ", precision_.name(), " on a CPU without native bfloat16 matrix products (x86: "
                 "AVX512-BF16 or AMX): LibTorch multiplies bfloat16 matrices with a generic kernel, 10-60x slower "
                 "than float32 on such CPUs, so 32-true trains faster here");
  }
  // Note [Device placement] (accelerator.h): the worker's device becomes
  // the current one before the process group starts (NCCL binds its
  // communicator to the current device) and before any CUDA allocation,
  // so nothing lands on cuda:0 by default.
  set_current_device(accelerator_->device(env_.local_rank));
  comm::ProcessGroupOptions options;
  options.device_type = accelerator_->name();
  options.group.timeout = collective_timeout_;
  group_ = comm::init_process_group(env_, options);
  launched_ = true;
}

c10::Device Strategy::root_device() const {
  STRATA_CHECK(launched_, ConfigError, "[", name(),
               "] root_device is only known after launch: call fabric.launch() (or "
               "strategy.setup_environment()) first");
  return accelerator_->device(env_.local_rank);
}

ModulePtr Strategy::setup_module(ModulePtr module) {
  STRATA_CHECK(module != nullptr, ConfigError, "[", name(), "] setup_module got a null module");
  module_to_device(*module);
  modules_.push_back(module);
  return module;
}

void Strategy::setup_optimizer(torch::optim::Optimizer&) {}

void Strategy::set_precision(Precision precision) {
  STRATA_CHECK(!launched_ || precision.name() == precision_.name(), ConfigError, "[", name(),
               "] the precision cannot change after launch (it is '", precision_.name(), "', asked for '",
               precision.name(), "')");
  precision_ = std::move(precision);
}

ModulePtr Strategy::setup_module_and_optimizers(ModulePtr module,
                                                const std::vector<torch::optim::Optimizer*>& optimizers) {
  ModulePtr result = setup_module(std::move(module));
  for (torch::optim::Optimizer* optimizer : optimizers) setup_optimizer(*optimizer);
  return result;
}

void Strategy::module_to_device(torch::nn::Module& module) {
  module.to(root_device());
  precision_.convert_module(module);  // bf16-true: the module in bf16
}

Scope Strategy::module_init_context(std::optional<bool>) { return Scope(); }

Scope meta_device_scope() {
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

void Strategy::backward(const at::Tensor& loss) {
  STRATA_CHECK(loss.defined(), ConfigError, "[", name(), "] backward got an undefined loss tensor");
  loss.backward();
}

void Strategy::optimizer_step(torch::optim::Optimizer& optimizer) { optimizer.step(); }

namespace {
// The deleter of a borrowed ModulePtr: the caller owns the module.
struct Borrowed {
  void operator()(torch::nn::Module*) const {}
};
}  // namespace

ModulePtr module_pointer(torch::nn::Module& module) {
  if (ModulePtr owner = module.weak_from_this().lock()) return owner;
  return ModulePtr(&module, Borrowed());
}

bool borrowed(const ModulePtr& module) { return std::get_deleter<Borrowed>(module) != nullptr; }

void Strategy::require_set_up(const torch::nn::Module& module, const std::string& what) const {
  for (const ModulePtr& m : modules_) {
    if (m.get() == &module) return;
  }
  throw ConfigError(::strata::detail::cat(
      "[", name(), "] ", what, " got a module that was not set up (", module.name(), ", ",
      modules_.empty() ? "and no module has been set up yet" : "not the one setup_module returned",
      "); pass the module returned by setup_module (fabric.setup_module(model)), as Lightning requires"));
}

at::Tensor Strategy::clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer&, double max_norm,
                                         double norm_type, bool error_if_nonfinite) {
  require_set_up(module, "clip_gradients");
  std::vector<at::Tensor> grads = grads_of(module);
  // The local part (max of |g|, or the sum of |g|^p) is reduced across ranks
  // by reduce_norm: a no-op where every rank holds whole gradients, a sum or
  // max where each holds a shard.
  at::Tensor total;
  bool is_max = std::isinf(norm_type);
  // On the gradients' device, which the process group's backend takes.
  const c10::Device device = !grads.empty() ? grads.front().device()
                            : launched_      ? root_device()
                                             : c10::Device(c10::kCPU);
  // The sum in f64 where the device has it (XLA devices such as TPUs do
  // not); the finiteness check is the accelerator's, read at the step's
  // end on a lazy device (Note [No reads inside a lazy step]).
  const at::ScalarType sum_type = accelerator_->has_float64() ? at::kDouble : at::kFloat;
  if (is_max) {
    std::vector<at::Tensor> maxes{at::zeros({}, at::TensorOptions(at::kFloat).device(device))};
    for (const at::Tensor& g : grads) maxes.push_back(g.detach().abs().max().to(at::kFloat));
    total = reduce_norm(at::stack(maxes).max(), true);
  } else {
    std::vector<at::Tensor> powers{at::zeros({}, at::TensorOptions(sum_type).device(device))};
    for (const at::Tensor& g : grads) powers.push_back(g.detach().to(sum_type).norm(norm_type).pow(norm_type));
    total = reduce_norm(at::stack(powers).sum(), false).pow(1.0 / norm_type).to(at::kFloat);
  }
  if (error_if_nonfinite) {
    const bool deferred = !accelerator_->reads_inside_step();
    accelerator_->check_at_step_end(
        total.isfinite(), "[" + name() + "] the total norm of order " + std::to_string(norm_type) +
                              " of the gradients is non-finite, so it cannot be clipped; pass "
                              "error_if_nonfinite=false to clip anyway" +
                              (deferred ? " (read when the step was marked, after it ran)" : ""));
  }
  at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (at::Tensor& g : grads) g.detach().mul_(coef.to(g.device(), g.scalar_type()));
  return total;
}

void Strategy::clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer&, double clip_val) {
  STRATA_CHECK(clip_val >= 0, ConfigError, "[", name(), "] clip_val must be >= 0, got ", clip_val);
  require_set_up(module, "clip_gradients");
  for (at::Tensor& g : grads_of(module)) g.detach().clamp_(-clip_val, clip_val);
}

Scope Strategy::no_backward_sync(torch::nn::Module& module, bool) {
  require_set_up(module, "no_backward_sync");
  return Scope();
}

at::Tensor Strategy::all_gather(const at::Tensor& tensor, bool sync_grads) {
  // A 0-d tensor gathers to shape (world_size,), as (world_size, *shape) says.
  if (sync_grads) return AllGatherFunction::apply(tensor, &group_);
  return group_.all_gather(tensor.detach());
}

at::Tensor Strategy::all_reduce(const at::Tensor& tensor, comm::ReduceOp op) {
  at::Tensor result = tensor.detach().clone();
  group_.all_reduce(result, op);
  return result;
}

at::Tensor Strategy::all_reduce(const at::Tensor& tensor, const std::string& op) {
  return all_reduce(tensor, comm::parse_reduce_op(op));
}

at::Tensor Strategy::broadcast(const at::Tensor& tensor, int src) {
  STRATA_CHECK(src >= 0 && src < world_size(), ConfigError, "[", name(), "] broadcast src ", src,
               " is not a rank of this job (world size ", world_size(), ")");
  // The step so far ends first (on a lazy device it runs, while every
  // rank's step is still the same): from here the source alone copies what
  // it sends (Note [Collectives of the replicas] in
  // src/xla_device/replicas.cpp).
  mark_step();
  // Ranks may hold tensors of other shapes (or none): send shape and dtype first.
  nlohmann::json meta;
  if (global_rank() == src) {
    meta = {{"shape", tensor.sizes().vec()}, {"dtype", static_cast<int>(tensor.scalar_type())}};
  }
  meta = group_.broadcast_object(meta, src);
  at::Tensor result;
  auto options = at::TensorOptions()
                     .dtype(static_cast<c10::ScalarType>(meta["dtype"].get<int>()))
                     .device(tensor.defined() ? tensor.device() : c10::Device(c10::kCPU));
  if (global_rank() == src) {
    result = tensor.detach().clone().contiguous();
  } else {
    result = at::empty(meta["shape"].get<std::vector<int64_t>>(), options);
  }
  group_.broadcast(result, src);
  return result;
}

void Strategy::barrier(const std::string& name) { group_.barrier(name); }

void Strategy::check_parallel_devices(const std::optional<std::vector<c10::Device>>& devices) const {
  if (!devices) return;
  STRATA_CHECK(static_cast<int>(devices->size()) == env_.local_world_size, ConfigError, "[", name(),
               "] parallel_devices lists ", devices->size(), " devices but this host runs ", env_.local_world_size,
               " workers; pass one device per local worker or leave parallel_devices unset");
}

void Strategy::setup_parallel_environment(const std::optional<std::vector<c10::Device>>& devices, bool debug) {
  check_parallel_devices(devices);
  group_.set_debug(debug);
}

void Strategy::report_step_communication(int64_t step, bool debug) {
  if (!debug) return;
  comm::CommStats stats = group_.stats();
  log::info("[", name(), "] step ", step, " communication: ", stats.summary());
  group_.reset_stats();
}

void Strategy::remove_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path target = fs::absolute(path).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "ckpt/step-1/"
  remove_checkpoint(target.string(), target.parent_path().string());
}

// Note [Removal stays inside the folder]
// The paths ModelCheckpoint deletes come from its state, which a resumed
// run reads from a checkpoint that may come from anywhere; so the removal
// itself refuses anything but an entry directly inside the folder it is
// given. The lexical check (no "..", the folder as parent, both
// normalised) is the same on every rank and made before any barrier, so
// every rank throws together. The checks on disk (not a symbolic link; the
// resolved parent is the resolved folder) are made where the removal
// happens, on local rank 0 of each host, and the outcome is voted on
// (reduce_boolean_decision, which also ends the removal as the closing
// barrier did), so a refusal on one host is an error on every rank rather
// than a hang. A missing path is nothing to remove.
void Strategy::remove_checkpoint(const std::string& path, const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path given(path);
  bool inside = !path.empty() && !folder.empty();
  for (const fs::path& part : given) inside = inside && part != "..";
  const fs::path child = given.lexically_normal();
  fs::path dir = fs::path(folder).lexically_normal();
  if (dir.filename().empty() && dir != dir.root_path()) dir = dir.parent_path();  // "ckpt/" is "ckpt"
  if (dir == ".") dir = "";
  inside = inside && !child.filename().empty() && child.filename() != "." && child.filename() != ".." &&
           child.parent_path() == dir;
  STRATA_CHECK(inside, CheckpointError, "[checkpoint] remove_checkpoint refuses '", path,
               "': it is not an entry directly inside the folder '", folder,
               "' it was asked to delete in; nothing was removed");
  // Ranks may still be reading the checkpoint: remove only once all are done.
  barrier("remove_checkpoint:begin");
  std::string refusal;
  if (local_rank() == 0) {
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(path, ec);
    if (!ec && fs::is_symlink(status)) {
      refusal = "it is a symbolic link, not a checkpoint strata wrote; nothing was removed";
    } else if (!ec && fs::exists(status)) {
      std::error_code ec_dir;
      const fs::path resolved = fs::weakly_canonical(path, ec);
      const fs::path real_folder = fs::weakly_canonical(folder, ec_dir);
      if (ec || ec_dir || resolved.parent_path() != real_folder) {
        refusal = "it resolves to '" + resolved.string() + "', outside the folder '" + real_folder.string() +
                  "'; nothing was removed";
      } else {
        fs::remove_all(path, ec);
        if (ec) refusal = "cannot remove it: " + ec.message();
      }
    }
  }
  const bool removed = reduce_boolean_decision(refusal.empty(), /*all=*/true);
  STRATA_CHECK(removed, CheckpointError, "[checkpoint] remove_checkpoint('", path, "') in '", folder, "': ",
               refusal.empty() ? std::string("local rank 0 of another host refused it (its error says why)")
                               : refusal);
}

void Strategy::mark_step() { accelerator_->end_step(); }

void Strategy::teardown() {
  for (const ModulePtr& module : modules_) {
    if (!borrowed(module)) module->to(c10::Device(c10::kCPU));  // Note [Modules held by value]
  }
  modules_.clear();
  detail::release_sync_batchnorm(this);
  close_loaders();
  if (launched_) group_.synchronize();
  group_ = comm::Group();
  launched_ = false;
}

// ---- the Trainer's helpers ----------------------------------------------------------

// One vote per rank, the Trainer's way of making callbacks (early
// stopping, checkpoint top-k) agree on all ranks.
bool Strategy::reduce_boolean_decision(bool decision, bool all) {
  at::Tensor votes = at::scalar_tensor(decision ? 1.0 : 0.0, at::kFloat);
  at::Tensor total = all_reduce(votes, comm::ReduceOp::kSum);
  const int yes = static_cast<int>(total.item<float>() + 0.5f);
  return all ? yes == world_size() : yes > 0;
}

// Batches reach the device through a background prefetching DeviceLoader
// (the MpDeviceLoader role).
std::shared_ptr<data::Loader> Strategy::process_dataloader(std::shared_ptr<data::Loader> loader) {
  STRATA_CHECK(loader != nullptr, ConfigError, "[", name(), "] process_dataloader got a null loader");
  // Each pass starts the next epoch (Lightning's loaders call set_epoch on
  // every iteration); an explicit set_epoch/load_state still decides.
  // The loader also ends the step at each batch (Note [No reads inside a
  // lazy step]): the accelerator's end_step, nothing on an eager device.
  const auto mark = [accelerator = accelerator_](data::DeviceLoader& l) {
    l.mark_steps_with([accelerator] { accelerator->end_step(); });
  };
  if (auto existing = std::dynamic_pointer_cast<data::DeviceLoader>(loader)) {
    existing->advance_epoch_each_pass(true);
    mark(*existing);
    return loader;
  }
  if (loader->is_device_loader()) return loader;
  auto device_loader = std::make_shared<data::DeviceLoader>(std::move(loader), root_device());
  device_loader->advance_epoch_each_pass(true);
  mark(*device_loader);
  loaders_.push_back(device_loader);
  return device_loader;
}

void Strategy::close_loaders() {
  for (const std::weak_ptr<data::Loader>& weak : loaders_) {
    if (auto loader = std::dynamic_pointer_cast<data::DeviceLoader>(weak.lock())) loader->close();
  }
  loaders_.clear();
}

}  // namespace strata::strategies
