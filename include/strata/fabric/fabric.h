// strata::Fabric: the user's entry point, as Lightning Fabric is in Python.
// Configure it with FabricOptions, call launch(fn), and write the training
// loop against it: setup_module, setup_optimizer, setup_dataloader,
// backward, clip_gradients, save/load, collectives. Every method routes
// through the strategy (DDP, single device, ...).
//
//   strata::Fabric fabric(strata::FabricOptions().with_devices(2).with_strategy("ddp"));
//   double loss = fabric.launch([](strata::Fabric& f) { ...; return loss; });
//
// Process model (Note [One launch protocol], strategies/placement.h): with
// several devices and no launcher, the first launch() makes this process
// rank 0 and re-executes the program as the other ranks (Note [The
// launching process is rank 0], strategies/launchers/subprocess.h). Every
// rank runs the whole program: the code before launch() (a start-up line
// prints once per rank), fn, and the code after launch(), where each rank
// has its own result; every rank leaves through main(). A program started
// by an outside launcher (strata launch, torchrun-style variables, MPI,
// SLURM) is one of the ranks already: launch() runs fn in place.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "strata/data/loader.h"
#include "strata/data/torch_dataset.h"
#include "strata/strategies/make_strategy.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"

namespace strata {

/// How a Fabric runs: a Placement (accelerator, devices, num_nodes,
/// strategy, precision, seed, collective_timeout, with their with_x
/// setters); validated by the Fabric constructor.
struct FabricOptions : WithPlacement<FabricOptions> {};

/// The training entry point. One per process.
/// clip_gradients by global norm: Lightning's max_norm, norm_type and
/// error_if_nonfinite.
struct ClipByNorm {
  double max_norm;
  double norm_type = 2.0;
  bool error_if_nonfinite = true;
};
/// clip_gradients by value: every gradient clamped to [-value, value].
struct ClipByValue {
  double value;
};

class Fabric {
 public:
  /// Validates `options` (ConfigError names the bad field) and builds the
  /// accelerator, precision and strategy. Starts nothing.
  explicit Fabric(FabricOptions options = {});
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  /// Runs `fn(*this)` on every rank and returns this rank's result (rank
  /// 0's where the ranks are threads of this process; see the process model
  /// above). The result type must be void or convertible to
  /// and from nlohmann::json. A worker's failure stops the others and
  /// throws LaunchError naming the rank, how it failed and its last error.
  /// Throws ConfigError when called twice on one Fabric.
  template <class Fn>
  auto launch(Fn&& fn) -> std::invoke_result_t<Fn, Fabric&> {
    using Result = std::invoke_result_t<Fn, Fabric&>;
    if constexpr (std::is_void_v<Result>) {
      run_launch([&]() -> nlohmann::json {
        fn(*this);
        return nullptr;
      });
    } else {
      // Every rank process returns fn's own value; ranks run as threads
      // (Note [Ranks as threads]) keep rank 0's.
      std::optional<Result> value;
      nlohmann::json result = run_launch([&]() -> nlohmann::json {
        Result mine = fn(*this);
        const bool keep = is_global_zero() || !placement_.thread_ranks();
        if (keep) value.emplace(std::move(mine));
        if (!is_global_zero()) return nullptr;
        return nlohmann::json(*value);
      });
      if (value) return std::move(*value);
      return result.template get<Result>();
    }
  }

  // ---- set-up ----------------------------------------------------------------
  /// Prepares a module for the strategy and returns the module to train
  /// (for DDP the same object, with gradient hooks registered).
  strategies::ModulePtr setup_module(strategies::ModulePtr module);
  /// Typed form for LibTorch module holders (`GPT model(...)`).
  template <class Holder, class = decltype(std::declval<Holder&>().ptr())>
  Holder setup_module(Holder module) {
    setup_module(strategies::ModulePtr(module.ptr()));
    return module;
  }
  /// Typed form for a shared_ptr to a module class (`std::make_shared<NetImpl>()`).
  template <class M, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M> &&
                                              !std::is_same_v<M, torch::nn::Module>>>
  std::shared_ptr<M> setup_module(std::shared_ptr<M> module) {
    setup_module(strategies::ModulePtr(module));
    return module;
  }
  /// A module held by value (`Net model; fabric.setup_module(model);`, as
  /// LibTorch's examples hold theirs): set up in place, not owned, so the
  /// caller keeps it alive while training it (Note [Modules held by value]
  /// in strategies/strategy.h). Returns `module`.
  template <class M, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>>
  M& setup_module(M& module) {
    setup_module(borrow(module));
    return module;
  }
  /// setup_module, then setup_optimizer for each optimizer (Lightning's
  /// setup(model, *optimizers)). FSDP refuses: its optimizers must be built
  /// from the module setup_module returns.
  strategies::ModulePtr setup(strategies::ModulePtr module,
                              const std::vector<torch::optim::Optimizer*>& optimizers = {});
  /// Typed form: `model = fabric.setup(model, optimizer)`.
  template <class Holder, class... Optimizers, class = decltype(std::declval<Holder&>().ptr())>
  Holder setup(Holder module, Optimizers&... optimizers) {
    setup(strategies::ModulePtr(module.ptr()), {static_cast<torch::optim::Optimizer*>(&optimizers)...});
    return module;
  }
  /// A module held by value, as setup_module(M&).
  template <class M, class... Optimizers, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>>
  M& setup(M& module, Optimizers&... optimizers) {
    setup(borrow(module), {static_cast<torch::optim::Optimizer*>(&optimizers)...});
    return module;
  }
  /// Scope for building the model (Lightning's init_module): the
  /// strategy's module_init_context. Under FSDP, empty_init=true builds on
  /// the meta device (no memory, no initialisation; setup_module then
  /// materialises zero shards, to be loaded).
  strategies::Scope init_module(std::optional<bool> empty_init = std::nullopt);
  /// Registers an optimizer of a module returned by setup_module.
  void setup_optimizer(torch::optim::Optimizer& optimizer);
  void setup_optimizers(const std::vector<torch::optim::Optimizer*>& optimizers);
  /// Wraps a loader so that batches arrive on device(), prefetched in the
  /// background. Build the loader with data::make_distributed_loader (or
  /// give it a DistributedSampler) so each rank reads its own slice.
  std::shared_ptr<data::Loader> setup_dataloader(std::shared_ptr<data::Loader> loader);
  /// This rank's loader of `dataset` (data::make_distributed_loader with
  /// this job's world size and rank: options.batch_size is the global
  /// batch, the same examples at any world size), prefetched to device().
  /// Inside launch(). A rank's batch may be a smaller share of its global
  /// batch at an uneven end (Note [Unequal shares]): weight its loss by
  /// batch.share(world_size()). ConfigError for a batch_size the world
  /// size does not divide.
  std::shared_ptr<data::Loader> setup_dataloader(std::shared_ptr<const data::Dataset> dataset,
                                                 const data::DataOptions& options = {});
  /// A `torch::data` dataset (a Dataset<Self> of Example<>, or one
  /// `.map()`ped with transforms such as Stack<>), moved in: adapted by
  /// data::TorchDataset, then as above.
  template <class TorchData, class = std::enable_if_t<data::is_torch_dataset_v<TorchData>>>
  std::shared_ptr<data::Loader> setup_dataloader(TorchData dataset, const data::DataOptions& options = {}) {
    return setup_dataloader(data::from_torch(std::move(dataset)), options);
  }
  std::vector<std::shared_ptr<data::Loader>> setup_dataloaders(
      const std::vector<std::shared_ptr<data::Loader>>& loaders);

  // ---- training step -----------------------------------------------------------
  /// Backpropagates and synchronises gradients as the strategy does.
  void backward(const at::Tensor& loss);
  /// Clips the gradients of `module` by global norm (max_norm) or by value
  /// (clip_val): exactly one must be given. Returns the norm before clipping
  /// (by norm), or an undefined tensor (by value).
  at::Tensor clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                            std::optional<double> max_norm, std::optional<double> clip_val = std::nullopt,
                            double norm_type = 2.0, bool error_if_nonfinite = true);
  /// Readable forms: `clip_gradients(model, opt, ClipByNorm{1.0})` (returns
  /// the norm before clipping) and `clip_gradients(model, opt, ClipByValue{0.5})`.
  at::Tensor clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const ClipByNorm& clip);
  void clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const ClipByValue& clip);
  /// Skips gradient synchronisation while the scope is alive (gradient
  /// accumulation); the next synchronised backward reduces the sum.
  strategies::Scope no_backward_sync(torch::nn::Module& module, bool enabled = true);
  /// Scope for forward: autocast to the precision's compute dtype
  /// (bf16-mixed), nothing for 32-true.
  strategies::Precision::ForwardContext autocast() const;

  // ---- collectives -----------------------------------------------------------------
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false);
  at::Tensor all_reduce(const at::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::kMean);
  at::Tensor all_reduce(const at::Tensor& tensor, const std::string& op);
  at::Tensor broadcast(const at::Tensor& tensor, int src = 0);
  /// Collections of tensors, element by element (each element as the
  /// single-tensor form does): a vector, or a map keyed by name (every rank
  /// passes the same keys, in any order).
  std::vector<at::Tensor> all_gather(const std::vector<at::Tensor>& tensors, bool sync_grads = false);
  std::map<std::string, at::Tensor> all_gather(const std::map<std::string, at::Tensor>& tensors,
                                               bool sync_grads = false);
  std::vector<at::Tensor> all_reduce(const std::vector<at::Tensor>& tensors, comm::ReduceOp op = comm::ReduceOp::kMean);
  std::map<std::string, at::Tensor> all_reduce(const std::map<std::string, at::Tensor>& tensors,
                                               comm::ReduceOp op = comm::ReduceOp::kMean);
  /// Broadcasts rank `src`'s collection: other ranks may pass an empty one
  /// (or one of other shapes); they receive src's elements, shapes and dtypes.
  std::vector<at::Tensor> broadcast(const std::vector<at::Tensor>& tensors, int src = 0);
  std::map<std::string, at::Tensor> broadcast(const std::map<std::string, at::Tensor>& tensors, int src = 0);
  template <class T>
  T broadcast(const T& value, int src = 0) {
    return strategy().broadcast(value, src);
  }
  void barrier(const std::string& name = "");

  // ---- checkpoints -------------------------------------------------------------------
  /// Saves `state` (modules, optimizers, tensors, values) to the checkpoint
  /// directory `path`, atomically. Every rank must call it.
  void save(const std::string& path, const strategies::State& state, const strategies::StateFilter& filter = {});
  /// Restores `state` in place from `path`; returns what the checkpoint
  /// held that `state` did not ask for. Every rank must call it.
  nlohmann::json load(const std::string& path, strategies::State& state, bool strict = true);
  /// Loads a plain, non-distributed checkpoint into one module or optimizer
  /// (Lightning's load_raw): a safetensors state dict, a `strata ckpt
  /// export` folder, or a strata checkpoint's only module (optimizer)
  /// entry (Strategy::load_raw). Every rank must call it.
  void load_raw(const std::string& path, torch::nn::Module& module, bool strict = true);
  void load_raw(const std::string& path, torch::optim::Optimizer& optimizer, bool strict = true);
  /// Typed form for LibTorch module holders.
  template <class Holder, class = decltype(std::declval<Holder&>().ptr())>
  void load_raw(const std::string& path, Holder& module, bool strict = true) {
    load_raw(path, *module.ptr(), strict);
  }

  // ---- utilities ----------------------------------------------------------------------
  /// Prints the arguments followed by a newline, on global rank 0 only.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_global_zero()) return;
    std::ostringstream out;
    (out << ... << args);
    std::cout << out.str() << std::endl;
  }
  /// Seeds LibTorch's generator (the same seed on every rank).
  static void seed_everything(uint64_t seed);

  /// Rank, local rank, host index and job size of this worker (as the
  /// strategy reports them; rank 0 of 1 outside launch()).
  int global_rank() const { return strategy().global_rank(); }
  int local_rank() const { return strategy().local_rank(); }
  int node_rank() const { return strategy().node_rank(); }
  int world_size() const { return strategy().world_size(); }
  /// True on global rank 0.
  bool is_global_zero() const { return strategy().is_global_zero(); }
  /// This worker's device (only known inside launch()).
  c10::Device device() const { return strategy().root_device(); }
  /// The strategy every call goes through.
  /// On a rank launch() runs as a thread, that rank's (Note [Ranks as
  /// threads] in strategies/xla.h).
  strategies::Strategy& strategy() const { return strategies::strategy_of_thread(*strategy_); }
  /// The options after validation (devices resolved).
  const FabricOptions& options() const { return options_; }
  /// Where the job runs: the accelerator, world, processes per host and
  /// devices per process resolved from the options.
  const strategies::ResolvedPlacement& placement() const { return placement_; }

 private:
  nlohmann::json run_launch(const std::function<nlohmann::json()>& call);
  /// module_pointer(module), refused where the strategy cannot borrow it.
  strategies::ModulePtr borrow(torch::nn::Module& module);

  FabricOptions options_;
  strategies::ResolvedPlacement placement_;
  std::shared_ptr<strategies::Strategy> strategy_;
  bool launch_called_ = false;
};

}  // namespace strata
