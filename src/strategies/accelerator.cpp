// Accelerators and precisions: the small objects strategies are handed.
#include "strata/strategies/accelerator.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/strategies/precision.h"
#include "strata/strategies/state.h"

namespace strata::strategies {
namespace {

class CpuAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device(int) const override { return c10::Device(c10::kCPU); }
  int auto_device_count() const override { return 1; }
};

class CudaAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cuda"; }
  c10::Device device(int local_rank) const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  int auto_device_count() const override { return static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()); }
};

}  // namespace

std::shared_ptr<Accelerator> cpu_accelerator() { return std::make_shared<CpuAccelerator>(); }

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  std::string n = lower(name);
  if (n == "cpu") return cpu_accelerator();
  if (n == "cuda" || n == "gpu") {
    STRATA_CHECK(at::hasCUDA(), ConfigError, "[accelerator] '", name,
                 "' asked for, but this LibTorch has no CUDA (or no GPU is visible); use accelerator 'cpu' "
                 "or build strata against a CUDA LibTorch");
    return std::make_shared<CudaAccelerator>();
  }
  if (n == "auto") return at::hasCUDA() ? std::make_shared<CudaAccelerator>() : cpu_accelerator();
  if (n == "xla" || n == "tpu") {
    throw ConfigError("[accelerator] '" + name +
                      "' (XLA devices) is not supported yet: strata trains on 'cpu' and 'cuda' today; "
                      "XLA through PJRT is planned");
  }
  throw ConfigError("[accelerator] unknown accelerator '" + name + "'; choose one of: cpu, cuda, gpu, auto");
}

// ---- precision ----------------------------------------------------------------

Precision Precision::parse(const std::string& name, const std::string& device_type) {
  std::string n = lower(name);
  if (n == "32-true" || n == "32" || n == "fp32" || n == "32-bit") return Precision("32-true", c10::kFloat, device_type);
  if (n == "bf16-mixed") return Precision("bf16-mixed", c10::kBFloat16, device_type);
  if (n == "16-mixed" && device_type == "cuda") return Precision("16-mixed", c10::kHalf, device_type);
  if (n == "bf16-true" || n == "16-true" || n == "16-mixed" || n == "64-true") {
    throw ConfigError("[precision] '" + name + "' is not supported on " + device_type +
                      " yet; choose 32-true or bf16-mixed" + (device_type == "cuda" ? " or 16-mixed" : ""));
  }
  throw ConfigError("[precision] unknown precision '" + name +
                    "'; choose one of: 32-true, bf16-mixed (and 16-mixed on cuda)");
}

// LibTorch 2's device-generic autocast state: one enabled flag and one
// dtype per device type.
Precision::ForwardContext::ForwardContext(const Precision& precision) {
  if (!precision.autocast()) return;
  active_ = true;
  device_type_ = precision.device_type_;
  const c10::DeviceType device = device_type_ == "cpu" ? c10::kCPU : c10::kCUDA;
  was_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_dtype(device, precision.compute_dtype());
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

Precision::ForwardContext::~ForwardContext() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  const c10::DeviceType device = device_type_ == "cpu" ? c10::kCPU : c10::kCUDA;
  at::autocast::set_autocast_enabled(device, was_enabled_);
  at::autocast::set_autocast_dtype(device, previous_dtype_);
}

const char* StateValue::kind() const {
  if (is_module()) return "module";
  if (is_optimizer()) return "optimizer";
  if (is_tensor()) return "tensor";
  return "value";
}

}  // namespace strata::strategies
