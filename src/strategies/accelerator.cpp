// Accelerators: which devices a strategy runs on, and how many.
#include "strata/strategies/accelerator.h"

#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/xla/client.h"
#include "strata/xla_device/device.h"
#include "strata/xla_device/replicas.h"

namespace strata::strategies {
namespace {

class CpuAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device(int) const override { return c10::Device(c10::kCPU); }
  int auto_device_count() const override { return 1; }
};

int visible_gpus() { return static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()); }

class CudaAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cuda"; }
  c10::Device device(int local_rank) const override {
    const int index = cuda_device_index(local_rank, visible_gpus(), std::getenv("CUDA_VISIBLE_DEVICES"));
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  int auto_device_count() const override { return visible_gpus(); }
};

// ", CUDA_VISIBLE_DEVICES=..." or ", CUDA_VISIBLE_DEVICES unset", for messages.
std::string visible_note(const char* visible_devices) {
  if (visible_devices == nullptr) return "CUDA_VISIBLE_DEVICES is unset";
  std::string value(visible_devices);
  if (value.size() > 200) value = value.substr(0, 200) + "...";
  return "CUDA_VISIBLE_DEVICES='" + value + "'";
}

// CUDA_VISIBLE_DEVICES names exactly one device ("3", "GPU-<uuid>", "MIG-...").
bool names_one_device(const char* visible_devices) {
  if (visible_devices == nullptr) return false;
  std::string value(visible_devices);
  const size_t first = value.find_first_not_of(" \t");
  return first != std::string::npos && value.find(',') == std::string::npos;
}

std::string gpus(int n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

// The devices of the PJRT plugin strata::xla finds (strata/xla_device/device.h);
// the plugin's client starts on the first query.
class XlaAccelerator : public Accelerator {
 public:
  std::string name() const override { return "xla"; }
  c10::Device device(int local_rank) const override { return xla::device(local_rank); }
  int auto_device_count() const override { return xla::device_count(); }
  // Note [Ranks as threads] (strategies/xla.h): the plugin's client drives
  // every local device from this process.
  int devices_per_process(int devices) const override { return devices; }
  // Note [No reads inside a lazy step] (accelerator.h): the device records
  // a step and runs it when the step ends, with the checks deferred to it.
  bool reads_inside_step() const override { return false; }
  void end_step() const override { xla::mark_step(); }
  void check_at_step_end(const at::Tensor& ok, const std::string& message) const override {
    xla::check_after_step(ok, message);
  }
  // XLA devices such as TPUs have no float64.
  bool has_float64() const override { return false; }
  CompiledPrograms compiled_programs() const override {
    const xla::Metrics m = xla::metrics();
    return {m.compiles, m.compile_reasons.empty() ? std::string() : m.compile_reasons.back()};
  }
  ThreadRanks thread_ranks(int ranks, std::chrono::milliseconds timeout) const override {
    std::vector<int> devices(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
    auto group = std::make_shared<xla::ReplicaGroup>(devices, timeout);
    ThreadRanks out;
    for (int r = 0; r < ranks; ++r) out.backends.push_back(group->backend(r));
    out.abort = [group](const std::string& reason) { group->abort(reason); };
    out.steps = [group] { return group->steps(); };
    out.pause = [group](bool paused) { group->pause(paused); };
    out.finish = [group](int rank) { group->finish(rank); };
    out.set_on_wait = [group](std::function<void(int)> on_wait) { group->set_on_wait(std::move(on_wait)); };
    return out;
  }
};

}  // namespace

void Accelerator::check_at_step_end(const at::Tensor& ok, const std::string& message) const {
  if (!ok.item<bool>()) throw Error(message);
}

ThreadRanks Accelerator::thread_ranks(int, std::chrono::milliseconds) const {
  throw ConfigError("[accelerator] '" + name() + "' runs one process per device, not ranks as threads");
}

int resolve_devices(const std::string& kind, int requested, int available, const char* visible_devices) {
  STRATA_CHECK(requested == -1 || requested >= 1, ConfigError, "[accelerator] devices must be >= 1 (or -1 for "
               "every visible device), got ", requested);
  if (lower(kind) == "cpu") return requested == -1 ? 1 : requested;
  if (lower(kind) == "xla") {
    STRATA_CHECK(available >= 1, ConfigError, "[accelerator] devices=", requested,
                 " on 'xla', but the PJRT plugin addresses no device");
    if (requested == -1) return available;
    STRATA_CHECK(requested <= available, ConfigError, "[accelerator] devices=", requested, " on 'xla', but the PJRT "
                 "plugin (", xla::find_plugin().path, ") addresses ", available, " device", available == 1 ? "" : "s",
                 "; ask for at most ", available);
    return requested;
  }
  STRATA_CHECK(available >= 1, ConfigError, "[accelerator] devices=", requested, " on '", kind,
               "', but this process sees no GPU (", visible_note(visible_devices),
               "); check nvidia-smi and CUDA_VISIBLE_DEVICES, or use accelerator 'cpu'");
  if (requested == -1) return available;
  STRATA_CHECK(requested <= available, ConfigError, "[accelerator] devices=", requested, " asks for ",
               gpus(requested), ", but this host has ", available, " visible (", visible_note(visible_devices),
               "); ask for at most ", available, ", or -1 for all of them");
  return requested;
}

int resolve_devices(const Accelerator& accelerator, int requested) {
  return resolve_devices(accelerator.name(), requested, accelerator.auto_device_count(),
                         std::getenv("CUDA_VISIBLE_DEVICES"));
}

int cuda_device_index(int local_rank, int available, const char* visible_devices) {
  STRATA_CHECK(local_rank >= 0, ConfigError, "[accelerator] local rank ", local_rank, " is negative");
  STRATA_CHECK(available >= 1, ConfigError, "[accelerator] local rank ", local_rank,
               " trains on a GPU, but this process sees none (", visible_note(visible_devices),
               "); check nvidia-smi and CUDA_VISIBLE_DEVICES, or use accelerator 'cpu'");
  if (local_rank < available) return local_rank;
  // A launcher gave each worker its own GPU: the one it sees is cuda:0.
  if (available == 1 && names_one_device(visible_devices)) return 0;
  throw ConfigError(::strata::detail::cat(
      "[accelerator] local rank ", local_rank, " would train on cuda:", local_rank, ", but this process sees ",
      gpus(available), " (cuda:0..cuda:", available - 1, "; ", visible_note(visible_devices), "); start at most ",
      available, " worker", available == 1 ? "" : "s", " per host, or give each worker one GPU with "
      "CUDA_VISIBLE_DEVICES"));
}

void set_current_device(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl guard(device.type());
  guard.setDevice(device);
}

bool cpu_has_native_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1U;
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = (a >> 5) & 1U;
  return amx_bf16 || avx512_bf16;
#elif defined(__aarch64__) && defined(HWCAP2_BF16)
  return (::getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}

std::shared_ptr<Accelerator> cpu_accelerator() { return std::make_shared<CpuAccelerator>(); }

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  std::string n = lower(name);
  if (n == "cpu") return cpu_accelerator();
  if (n == "cuda" || n == "gpu") {
    STRATA_CHECK(at::detail::getCUDAHooks().isBuilt(), ConfigError, "[accelerator] '", name,
                 "' asked for, but this LibTorch has no CUDA; use accelerator 'cpu' or build strata against a "
                 "CUDA LibTorch");
    STRATA_CHECK(at::hasCUDA(), ConfigError, "[accelerator] '", name, "' asked for, but no GPU is visible (",
                 visible_note(std::getenv("CUDA_VISIBLE_DEVICES")),
                 "); check nvidia-smi and CUDA_VISIBLE_DEVICES, or use accelerator 'cpu'");
    return std::make_shared<CudaAccelerator>();
  }
  if (n == "auto") return at::hasCUDA() ? std::make_shared<CudaAccelerator>() : cpu_accelerator();
  if (n == "xla" || n == "tpu") {
    // "tpu" asks for a TPU: the plugin found must be one (Lightning's name
    // for the XLA accelerator on TPU hosts), never the CPU plugin quietly.
    if (n == "tpu") {
      const std::string plugin = xla::find_plugin().path;
      STRATA_CHECK(xla::plugin_kind(plugin) == "tpu", ConfigError, "[accelerator] 'tpu' asks for a TPU, but the "
                   "PJRT plugin found is ", plugin, " (", xla::plugin_kind(plugin).empty() ? "not a TPU plugin"
                   : xla::plugin_kind(plugin) + " plugin", "); set STRATA_PJRT_PLUGIN to libtpu's plugin, or use "
                   "accelerator 'xla' for the plugin found");
    }
    // Finds the plugin and starts its client now, so a missing plugin is
    // refused before any worker starts (the error lists where it looked).
    xla::init();
    return std::make_shared<XlaAccelerator>();
  }
  throw ConfigError("[accelerator] unknown accelerator '" + name + "'; choose one of: cpu, cuda, gpu, auto, xla");
}

}  // namespace strata::strategies
