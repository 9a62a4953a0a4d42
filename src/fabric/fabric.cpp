// Fabric: option checks, the launch protocol, and thin forwarding to the
// strategy.
//
// Note [Fabric launch protocol]
// The launching process re-executes the current program through the
// launcher with STRATA_FABRIC_RESULT set to a file path. A worker that sees
// that variable runs fn, and rank 0 writes fn's result there as JSON; then
// the worker tears down and exits, so code after launch() runs only in the
// launching process, which reads the file and returns the result. Workers
// started by an outside launcher (no such variable) run fn in place and
// return normally.
#include "strata/fabric/fabric.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <fcntl.h>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/process.h"

namespace strata {
namespace {

constexpr const char* kResultVar = "STRATA_FABRIC_RESULT";

bool spawned_by_fabric() { return std::getenv(kResultVar) != nullptr; }

}  // namespace

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {
  STRATA_CHECK(options_.devices == -1 || options_.devices >= 1, ConfigError,
               "[fabric] devices must be >= 1 (or -1 for one per device), got ", options_.devices);
  STRATA_CHECK(options_.num_nodes >= 1, ConfigError, "[fabric] num_nodes must be >= 1, got ", options_.num_nodes);
  STRATA_CHECK(options_.collective_timeout.count() > 0, ConfigError,
               "[fabric] collective_timeout must be positive");
  std::shared_ptr<strategies::Accelerator> accelerator = strategies::make_accelerator(options_.accelerator);
  // -1: one worker per visible device; more GPUs than there are is refused
  // here, before any worker starts.
  options_.devices = strategies::resolve_devices(*accelerator, options_.devices);
  runtime::Environment env = runtime::Environment::from_env();
  int world_size = env.launched() ? env.world_size : options_.devices * options_.num_nodes;
  if (env.launched()) {
    STRATA_CHECK(env.local_world_size == options_.devices || options_.devices == 1, ConfigError,
                 "[fabric] this worker was started as one of ", env.local_world_size,
                 " per host, but devices=", options_.devices,
                 "; start as many workers as devices (or leave devices at 1 when an outside launcher decides)");
  }
  // Fabric's precision, when given, is a strategy object's too (Lightning's rule).
  strategy_ = strategies::resolve_strategy(options_.strategy, accelerator, options_.precision, world_size, "fabric");
  strategy_->set_collective_timeout(options_.collective_timeout);
}

Fabric::~Fabric() = default;

bool Fabric::needs_spawn() const {
  if (runtime::Environment::from_env().launched()) return false;
  return options_.devices * options_.num_nodes > 1;
}

nlohmann::json Fabric::spawn_workers() {
  STRATA_CHECK(!launch_called_, ConfigError,
               "[fabric] launch() was already called on this Fabric; state from the first run would be lost. "
               "Create a new Fabric for a second run");
  launch_called_ = true;
  STRATA_CHECK(options_.num_nodes == 1, ConfigError, "[fabric] num_nodes=", options_.num_nodes,
               ": a multi-node job is started by a launcher on every host, e.g. `strata launch --nnodes ",
               options_.num_nodes, " --node-rank R --master-addr HOST --master-port PORT -n ", options_.devices,
               " -- PROGRAM`");
  // Note [The result file]
  // Rank 0 returns its result through a file. It lives in a folder made by
  // mkdtemp (mode 0700, an unguessable name), never at a predictable name
  // in the shared temp folder where another user could plant a symbolic
  // link; the worker creates it with O_EXCL | O_NOFOLLOW.
  std::string folder = (std::filesystem::temp_directory_path() / "strata-fabric-XXXXXX").string();
  STRATA_CHECK(::mkdtemp(folder.data()) != nullptr, LaunchError, "[fabric] cannot create a private temp folder ",
               folder, ": ", ::strata::detail::errno_string(errno));
  const std::filesystem::path result_file = std::filesystem::path(folder) / "result.json";
  // The folder goes on every way out of this function.
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_folder{folder};
  runtime::LaunchOptions launch_options;
  launch_options.nproc_per_node = options_.devices;
  launch_options.extra_env[kResultVar] = result_file.string();
  runtime::LaunchResult result = runtime::launch_workers(runtime::current_command_line(), launch_options);
  if (result.exit_code != 0) throw LaunchError("[fabric] the workers failed: " + result.summary, result);
  nlohmann::json value = nullptr;
  std::ifstream in(result_file);
  if (in) {
    value = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    STRATA_CHECK(!value.is_discarded(), LaunchError, "[fabric] rank 0's result file ", result_file.string(),
                 " is not valid JSON");
  }
  return value;
}

void Fabric::enter_worker() {
  STRATA_CHECK(!launch_called_, ConfigError,
               "[fabric] launch() was already called on this Fabric; create a new Fabric for a second run");
  launch_called_ = true;
  strategy_->setup_environment();
  if (options_.seed) seed_everything(*options_.seed);
}

void Fabric::leave_worker(const nlohmann::json& result) {
  if (!spawned_by_fabric()) return;
  if (is_global_zero()) {
    std::string path = std::getenv(kResultVar);
    std::string tmp = path + ".tmp";
    const std::string text = result.dump();
    // O_EXCL | O_NOFOLLOW: never write through a name someone else made.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    STRATA_CHECK(fd >= 0, LaunchError, "[fabric] cannot create the result file ", tmp, ": ",
                 ::strata::detail::errno_string(errno));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    STRATA_CHECK(done == text.size(), LaunchError, "[fabric] cannot write the result to ", tmp);
    std::filesystem::rename(tmp, path);
  }
  strategy_->teardown();
  // Code after launch() runs in the launching process only: the launcher's
  // protocol ends this worker here.
  runtime::end_relaunched_worker(0, /*graceful=*/true);
}

void Fabric::fail_worker(const std::exception& error) {
  if (!spawned_by_fabric()) return;
  // The launcher reports a worker's last "error: " line as its reason.
  log::error(error.what());
  runtime::end_relaunched_worker(1, /*graceful=*/false);
}

strategies::ModulePtr Fabric::setup_module(strategies::ModulePtr module) {
  return strategy_->setup_module(std::move(module));
}

strategies::ModulePtr Fabric::setup(strategies::ModulePtr module,
                                    const std::vector<torch::optim::Optimizer*>& optimizers) {
  return strategy_->setup_module_and_optimizers(std::move(module), optimizers);
}

strategies::Scope Fabric::init_module(std::optional<bool> empty_init) {
  return strategy_->module_init_context(empty_init);
}

void Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) { strategy_->setup_optimizer(optimizer); }

void Fabric::setup_optimizers(const std::vector<torch::optim::Optimizer*>& optimizers) {
  for (torch::optim::Optimizer* optimizer : optimizers) strategy_->setup_optimizer(*optimizer);
}

std::shared_ptr<data::Loader> Fabric::setup_dataloader(std::shared_ptr<data::Loader> loader) {
  return strategy_->process_dataloader(std::move(loader));
}

std::vector<std::shared_ptr<data::Loader>> Fabric::setup_dataloaders(
    const std::vector<std::shared_ptr<data::Loader>>& loaders) {
  std::vector<std::shared_ptr<data::Loader>> out;
  for (const auto& loader : loaders) out.push_back(setup_dataloader(loader));
  return out;
}

void Fabric::backward(const at::Tensor& loss) { strategy_->backward(loss); }

at::Tensor Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                  std::optional<double> max_norm, std::optional<double> clip_val, double norm_type,
                                  bool error_if_nonfinite) {
  STRATA_CHECK(max_norm.has_value() != clip_val.has_value(), ConfigError,
               "[fabric] clip_gradients needs exactly one of max_norm and clip_val");
  if (clip_val) {
    strategy_->clip_gradients_value(module, optimizer, *clip_val);
    return at::Tensor();
  }
  return strategy_->clip_gradients_norm(module, optimizer, *max_norm, norm_type, error_if_nonfinite);
}

at::Tensor Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                  const ClipByNorm& clip) {
  return clip_gradients(module, optimizer, clip.max_norm, std::nullopt, clip.norm_type, clip.error_if_nonfinite);
}

void Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const ClipByValue& clip) {
  clip_gradients(module, optimizer, std::nullopt, clip.value);
}

strategies::Scope Fabric::no_backward_sync(torch::nn::Module& module, bool enabled) {
  return strategy_->no_backward_sync(module, enabled);
}

strategies::Precision::ForwardContext Fabric::autocast() const {
  return strategies::Precision::ForwardContext(strategy_->precision());
}

at::Tensor Fabric::all_gather(const at::Tensor& tensor, bool sync_grads) {
  return strategy_->all_gather(tensor, sync_grads);
}
at::Tensor Fabric::all_reduce(const at::Tensor& tensor, comm::ReduceOp op) { return strategy_->all_reduce(tensor, op); }
at::Tensor Fabric::all_reduce(const at::Tensor& tensor, const std::string& op) {
  return strategy_->all_reduce(tensor, op);
}
at::Tensor Fabric::broadcast(const at::Tensor& tensor, int src) { return strategy_->broadcast(tensor, src); }
void Fabric::barrier(const std::string& name) { strategy_->barrier(name); }

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
  strategy_->save_checkpoint(path, state, nullptr, filter);
}

void Fabric::load_raw(const std::string& path, torch::nn::Module& module, bool strict) {
  strategy_->load_raw(path, module, strict);
}

void Fabric::load_raw(const std::string& path, torch::optim::Optimizer& optimizer, bool strict) {
  strategy_->load_raw(path, optimizer, strict);
}

nlohmann::json Fabric::load(const std::string& path, strategies::State& state, bool strict) {
  return strategy_->load_checkpoint(path, state, strict);
}

void Fabric::seed_everything(uint64_t seed) {
  at::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
}

}  // namespace strata
