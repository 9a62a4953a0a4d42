// The strategy contract (DESIGN.md "Strategy contract"): how a model is
// placed, how gradients are synchronised, how collectives, data and
// checkpoints work across the workers of one job. Fabric calls a strategy;
// users may call it directly too. Every method of Lightning's XLAStrategy and XLAFSDPStrategy exists,
// with Lightning's defaults, adapted to C++ types.
//
// Before setup_environment() (that is, before launch) every rank query
// answers rank 0 of world size 1 and root_device() throws.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/group.h"
#include "strata/runtime/env.h"
#include "strata/strategies/accelerator.h"
#include "strata/strategies/precision.h"
#include "strata/strategies/saved_state.h"

namespace strata::data {
class Loader;
}
namespace strata::checkpoint {
class StateReader;
}
namespace strata {
class Trainer;
}

namespace strata::strategies {
struct SavePlan;
class Launcher;
}

namespace strata::strategies {

/// RAII scope returned by module_init_context() and no_backward_sync():
/// the strategy's setting holds while it is alive and is undone when it is
/// destroyed. Movable, not copyable.
class Scope {
 public:
  /// A scope that changes nothing.
  Scope() = default;
  /// A scope that runs `on_exit` when destroyed.
  explicit Scope(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  Scope(Scope&& other) noexcept : on_exit_(std::move(other.on_exit_)) { other.on_exit_ = nullptr; }
  Scope& operator=(Scope&&) = delete;
  ~Scope() {
    if (on_exit_) on_exit_();
  }

 private:
  std::function<void()> on_exit_;
};

/// While alive, modules are built on the meta device: parameters and
/// buffers get shapes and dtypes but no storage, and the example models
/// skip their initialisation (Note [Meta-device construction] in
/// fsdp/construction.cpp). FSDP's module_init_context(empty_init=true) is
/// this scope; tools that only need names and shapes use it too.
Scope meta_device_scope();

/// Note [Modules held by value]
/// LibTorch's examples hold a model by value (`Net model;`) as often as in
/// a ModuleHolder or a shared_ptr. A strategy keeps the modules it set up
/// (ModulePtr) until teardown; for a module no shared_ptr owns,
/// module_pointer gives a pointer that does not own it (borrowed): the
/// caller keeps the module alive while it trains it. A value declared
/// inside Fabric's launched function is gone before the strategy's
/// teardown, so teardown never touches a borrowed module (it stays on its
/// device). FSDP keeps parts of a module past the caller's use: a borrowed
/// root's children (its units) are kept by shared_ptr, and the root's own
/// hooks holder (Note [Hooks live in the module]), watched through a
/// weak_ptr, expires with the root, which tells FSDP that the root is gone
/// without touching it: its state is dropped then, and a module built
/// later at the same address is a new one.

/// A ModulePtr to `module`: its owner when a shared_ptr holds it (a
/// ModuleHolder's module, std::make_shared), else a borrowed pointer that
/// does not own it (Note [Modules held by value]).
ModulePtr module_pointer(torch::nn::Module& module);
/// True when `module` is a borrowed pointer made by module_pointer.
bool borrowed(const ModulePtr& module);

/// Note [One name for each operation]
/// Lightning names some operations twice: Fabric's strategies say
/// all_reduce and module_to_device(module), the Trainer's reduce and
/// model_to_device(). One Strategy class serves both here, with Fabric's
/// names, since Fabric is where users call a strategy's collectives
/// directly. model_to_device() stays in the Trainer's part: it moves the
/// connected module, a different call. reduce exists only on XlaStrategy,
/// whose seed (Lightning's XLAStrategy) lists it.

/// Base of every strategy. Holds the accelerator, the precision, this
/// process's environment and the process group.
class Strategy {
 public:
  Strategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision);
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  /// "single_device", "ddp", "fsdp".
  virtual std::string name() const = 0;
  /// True when each rank holds only a shard of the parameters (FSDP), so
  /// that a forward needs every rank.
  virtual bool shards_parameters() const { return false; }
  /// A new strategy of the same kind, options and precision for another
  /// rank of this job run as a thread of this process (Note [Ranks as
  /// threads] in strategies/xla.h). The default throws ConfigError.
  virtual std::shared_ptr<Strategy> replica() const;

  // ---- environment ---------------------------------------------------------
  /// Reads this process's place from the environment, creates the process
  /// group and marks the strategy launched. Call once per process before
  /// any collective.
  virtual void setup_environment();
  /// True after setup_environment().
  bool launched() const { return launched_; }
  /// How this strategy's ranks start (Lightning's `strategy.launcher`):
  /// set by resolve_placement (Fabric, Trainer); nullptr for a strategy
  /// used on its own or a thread rank's replica.
  const std::shared_ptr<Launcher>& launcher() const { return launcher_; }
  void set_launcher(std::shared_ptr<Launcher> launcher) { launcher_ = std::move(launcher); }
  /// This process's rank in the job (0 before launch).
  int global_rank() const { return env_.rank; }
  /// Its rank among the workers of this host (0 before launch).
  int local_rank() const { return env_.local_rank; }
  /// The index of this host (0 before launch).
  int node_rank() const { return env_.node_rank; }
  /// Number of workers in the job (1 before launch).
  int world_size() const { return env_.world_size; }
  /// Number of hosts in the job (1 before launch).
  int num_nodes() const { return env_.num_nodes; }
  /// True on global rank 0 (and before launch).
  bool is_global_zero() const { return env_.rank == 0; }
  /// The environment read by setup_environment().
  const runtime::Environment& environment() const { return env_; }
  /// This process's device. Throws ConfigError before setup_environment().
  c10::Device root_device() const;
  /// The accelerator this strategy trains on.
  const Accelerator& accelerator() const { return *accelerator_; }
  /// The precision forward and gradients use.
  const Precision& precision() const { return precision_; }
  /// Ends a step (the accelerator's end_step(): Note [No reads inside a
  /// lazy step] in accelerator.h): on a lazy device runs what it recorded
  /// and the checks deferred to the step's end; a no-op on an eager device.
  void mark_step();
  /// Replaces the precision (Fabric applies its own to a strategy object
  /// it is handed, as Lightning does). ConfigError after launch, or when
  /// the strategy's options need another precision.
  virtual void set_precision(Precision precision);
  /// The process group; a one-rank group before setup_environment().
  comm::Group& group() { return group_; }
  /// Collective timeout used by setup_environment() (default 30 min).
  void set_collective_timeout(std::chrono::milliseconds timeout) { collective_timeout_ = timeout; }

  // ---- model and optimizers ------------------------------------------------
  /// Prepares `module` for training (moves it, synchronises it, registers
  /// the gradient hooks) and returns the module to train with.
  virtual ModulePtr setup_module(ModulePtr module);
  /// Lightning's sync_batchnorm: whether the BatchNorm layers of modules
  /// set up normalise, in training, with the mean and variance of the
  /// global batch over all ranks (and update their running statistics
  /// from it). Default off; DDP's and FSDP's options, and the Trainer's
  /// flag, turn it on.
  virtual bool sync_batchnorm() const { return sync_batchnorm_; }
  /// Turns sync_batchnorm on or off for modules set up from now on.
  void set_sync_batchnorm(bool on) { sync_batchnorm_ = on; }
  /// With sync_batchnorm() on a job of several ranks, registers the
  /// BatchNorm1d/2d/3d layers of `module` (set up already) so that they
  /// normalise over all ranks in training (Note [Synchronised batch norm]
  /// in sync_batchnorm.cpp); returns how many it registered (a layer
  /// registered already counts once). A no-op otherwise. DDP's
  /// setup_module calls it, and Fabric and the Trainer call it after every
  /// strategy's setup_module. ConfigError on a lazy device (xla), where
  /// batch norm is not synchronised.
  size_t apply_sync_batchnorm(torch::nn::Module& module);
  /// Checks and prepares an optimizer of the module returned by setup_module.
  virtual void setup_optimizer(torch::optim::Optimizer& optimizer);
  /// setup_module, then setup_optimizer for each optimizer.
  virtual ModulePtr setup_module_and_optimizers(ModulePtr module,
                                                const std::vector<torch::optim::Optimizer*>& optimizers);
  /// Moves `module` to root_device().
  virtual void module_to_device(torch::nn::Module& module);
  /// Scope for creating the model. `empty_init`: true skips initialising
  /// parameters (they will be loaded); nullopt lets the strategy decide.
  virtual Scope module_init_context(std::optional<bool> empty_init = std::nullopt);
  /// Wraps a loader so batches arrive on root_device(), prefetched in the
  /// background; a loader that is already a device loader is returned as is.
  virtual std::shared_ptr<data::Loader> process_dataloader(std::shared_ptr<data::Loader> loader);

  // ---- training step -------------------------------------------------------
  /// Backpropagates `loss` and synchronises gradients as the strategy does.
  virtual void backward(const at::Tensor& loss);
  /// Steps `optimizer` (gradients are already synchronised).
  virtual void optimizer_step(torch::optim::Optimizer& optimizer);
  /// Scales the gradients of `module`'s parameters so their global p-norm
  /// is at most `max_norm`; returns the norm before clipping. Throws
  /// strata::Error when the norm is NaN or infinite and error_if_nonfinite,
  /// and ConfigError when `module` is not one setup_module returned (its
  /// gradients may not be what this strategy synchronised or sharded).
  virtual at::Tensor clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                         double max_norm, double norm_type = 2.0,
                                         bool error_if_nonfinite = true);
  /// Clamps every gradient of `module` to [-clip_val, clip_val]. ConfigError
  /// when `module` is not one setup_module returned.
  virtual void clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                    double clip_val);
  /// While the returned scope is alive (and `enabled`), backward() does not
  /// synchronise gradients: they accumulate locally, and the next
  /// synchronised backward reduces the sum (gradient accumulation).
  /// ConfigError when `module` is not one setup_module returned.
  virtual Scope no_backward_sync(torch::nn::Module& module, bool enabled = true);

  // ---- collectives (Lightning's `group` argument is implied) ----------
  /// Gathers `tensor` from every rank: shape (world_size, *tensor.shape).
  /// With sync_grads the gather is differentiable (each rank receives the
  /// gradient of its own slice). Before launch returns tensor.unsqueeze(0).
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false);
  /// Reduces a copy of `tensor` across ranks (default mean, as in
  /// Lightning); the result keeps the input's device and dtype.
  at::Tensor all_reduce(const at::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::kMean);
  /// all_reduce with the op given by name ("sum", "mean"/"avg", "max", "min").
  at::Tensor all_reduce(const at::Tensor& tensor, const std::string& op);
  /// Broadcasts a tensor from `src` (a new tensor on every rank).
  at::Tensor broadcast(const at::Tensor& tensor, int src = 0);
  /// Broadcasts any JSON-convertible value from `src`.
  template <class T>
  T broadcast(const T& value, int src = 0) {
    return group_.broadcast_object(value, src);
  }
  /// All ranks meet; `name` appears in timeout and debug messages.
  void barrier(const std::string& name = "");

  // ---- checkpoints ---------------------------------------------------------
  /// Saves `state` to `path` (a checkpoint directory, written atomically).
  /// `storage_options` must be empty (no CheckpointIO plugins yet).
  virtual void save_checkpoint(const std::string& path, const State& state,
                               const nlohmann::json& storage_options = nullptr,
                               const StateFilter& filter = {});
  /// Restores `state` from `path` in place; returns the entries the
  /// checkpoint had that `state` did not ask for. strict: every key of
  /// state must be in the checkpoint and every module tensor must match.
  virtual nlohmann::json load_checkpoint(const std::string& path, State& state, bool strict = true);
  /// Loads a plain state dict into `module` (Lightning's load_raw): a
  /// safetensors file of whole tensors under the module's own names (what
  /// `safetensors.torch.save_file(model.state_dict())` writes), a folder
  /// `strata ckpt export` wrote, or a strata checkpoint (its only module
  /// entry, or "model"). Any module; one setup_module returned is loaded as
  /// the strategy holds it (FSDP: each rank reads its slices). strict: every
  /// name must match both ways. Every rank must call it. Throws
  /// CheckpointError naming the file and what did not match.
  void load_raw(const std::string& path, torch::nn::Module& module, bool strict = true);
  /// Loads the state of `optimizer` from a strata checkpoint (a folder or
  /// one file) whose only optimizer entry, or the one named "optimizer",
  /// holds it, at any world size and from either strategy. The module it
  /// trains must be set up (its state is stored by parameter name).
  void load_raw(const std::string& path, torch::optim::Optimizer& optimizer, bool strict = true);
  /// Deletes a checkpoint (local rank 0 of every host, since hosts may not
  /// share a file system): remove_checkpoint(path, the folder holding it).
  virtual void remove_checkpoint(const std::string& path);
  /// Deletes the checkpoint `path`, which must be an entry directly inside
  /// `folder` (Note [Removal stays inside the folder] in strategy.cpp).
  /// Every rank must call it. Throws CheckpointError, on every rank and
  /// before anything is deleted, for a path outside the folder (lexically:
  /// '..', another parent), a symbolic link, or one that resolves outside
  /// it; and for a removal that fails.
  virtual void remove_checkpoint(const std::string& path, const std::string& folder);

  /// Releases the process group and loader threads; moves modules back to
  /// the CPU (not borrowed ones: Note [Modules held by value]).
  virtual void teardown();

  // ---- the Trainer's strategy (Lightning's Strategy API) -------------------------------------
  /// Attaches the module a Trainer trains (a strata::TrainModule), before
  /// setup(trainer) prepares it.
  void connect(ModulePtr module) { connected_ = std::move(module); }
  /// The module connect() attached (after setup(trainer): the one
  /// setup_module returned); null when none.
  const ModulePtr& lightning_module() const { return connected_; }
  /// Moves the connected module to root_device().
  void model_to_device() {
    if (connected_) module_to_device(*connected_);
  }
  /// Prepares the connected module for `trainer` (Lightning's
  /// setup(trainer)): Trainer::setup_strategy, which calls this strategy's
  /// setup_module, then setup_optimizer for each optimizer of the module's
  /// configure_optimizers() (built after setup_module, so FSDP's optimizers
  /// see the shards). Defined inline in trainer/trainer.h: the strategies
  /// sit below the Trainer and their code never refers to it.
  inline void setup(Trainer& trainer);
  /// True on every rank when `decision` holds on every rank (all) or on at
  /// least one (any): a collective, so every rank must call it.
  bool reduce_boolean_decision(bool decision, bool all = true);

 protected:
  /// Combines this rank's part of a gradient norm across ranks:
  /// `local` is the max of |g| (is_max, the inf-norm) or the sum of |g|^p.
  /// Strategies whose ranks hold whole gradients return it as is.
  virtual at::Tensor reduce_norm(const at::Tensor& local, bool is_max) { return local; }
  /// Note [Checkpoint planning] (src/strategies/checkpoint_plan.h): what
  /// this rank saves of `state`, entry by entry, through the two hooks below.
  virtual SavePlan plan_save(const State& state, const StateFilter& filter);
  /// Adds module entry `key`'s tensors to `plan` (whole, by default).
  virtual void plan_module_entry(const std::string& key, torch::nn::Module& module, const StateFilter& filter,
                                 SavePlan& plan);
  /// Adds optimizer entry `key`'s tensors ("<param>.<state>") to `plan`
  /// (whole, by default).
  virtual void plan_optimizer_entry(const std::string& key, torch::optim::Optimizer& optimizer,
                                    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    const StateFilter& filter, SavePlan& plan);
  /// True when saves use the sharded layout (one file per rank).
  virtual bool sharded_state_dict() const { return false; }
  /// True when local ranks write their files one after another.
  virtual bool sequential_checkpoint_writes() const { return false; }
  /// load_checkpoint's part for a module entry `key`: restores `module`
  /// from the checkpoint's tensors "<key>/..." (whole, by default).
  virtual void load_module_entry(const checkpoint::StateReader& reader, const std::string& key,
                                 torch::nn::Module& module, bool strict, const std::string& source);
  /// load_checkpoint's part for optimizer entry `key`: the tensors
  /// "<key>/<param>.<state>" as `optimizer` holds them (whole, by default).
  virtual std::vector<std::pair<std::string, at::Tensor>> read_optimizer_tensors(
      const checkpoint::StateReader& reader, const std::string& key, torch::optim::Optimizer& optimizer);
  /// Throws ConfigError unless `module` is one that setup_module returned
  /// (`what` names the call that needs it, e.g. "clip_gradients").
  void require_set_up(const torch::nn::Module& module, const std::string& what) const;
  /// Checks a strategy's parallel_devices option (Lightning's signature)
  /// against this host: one device per local worker, or unset.
  void check_parallel_devices(const std::optional<std::vector<c10::Device>>& devices) const;
  /// Stops the background threads of the device loaders made by
  /// process_dataloader.
  void close_loaders();
  /// setup_environment's part shared by DDP and FSDP: checks the
  /// parallel_devices option and turns the group's debug checks on.
  void setup_parallel_environment(const std::optional<std::vector<c10::Device>>& devices, bool debug);
  /// With `debug`, reports the communication of training step `step` on
  /// rank 0 and starts counting the next step's.
  void report_step_communication(int64_t step, bool debug);
  /// A scope that sets `owner->*flag` to `value` and puts the previous
  /// value back at its end (no_backward_sync).
  template <class T>
  static Scope set_for_scope(std::shared_ptr<T> owner, bool T::*flag, bool value) {
    bool previous = (*owner).*flag;
    (*owner).*flag = value;
    return Scope([owner, flag, previous] { (*owner).*flag = previous; });
  }

  std::shared_ptr<Accelerator> accelerator_;
  Precision precision_;
  runtime::Environment env_;
  comm::Group group_;
  bool launched_ = false;
  std::shared_ptr<Launcher> launcher_;
  std::chrono::milliseconds collective_timeout_ = std::chrono::minutes(30);
  std::vector<ModulePtr> modules_;  ///< modules set up, for teardown
  std::vector<std::weak_ptr<data::Loader>> loaders_;  ///< device loaders to close at teardown
  ModulePtr connected_;  ///< the Trainer's module (connect())
  bool sync_batchnorm_ = false;
};

}  // namespace strata::strategies
