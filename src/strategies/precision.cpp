// Precisions: the dtypes a strategy trains in (Lightning's precision
// plugins), parsed from Lightning's names.
#include "strata/strategies/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/module.h>

#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::strategies {

Precision Precision::parse(const std::string& name, const std::string& device_type) {
  std::string n = lower(name);
  const bool full = n == "32-true" || n == "32" || n == "fp32" || n == "32-bit";
  if (full) return Precision("32-true", c10::kFloat, device_type);
  if (n == "bf16-mixed") return Precision("bf16-mixed", c10::kBFloat16, device_type);
  // On xla the lowered kernels compute bf16 in f32 and round once, as
  // LibTorch's CPU kernels do (docs/xla.md, bf16 on xla); f16 is not
  // lowered yet.
  if (n == "bf16-true" && device_type == "xla")
    return Precision("bf16-true", c10::kBFloat16, device_type, c10::kBFloat16);
  if (device_type == "xla" && (n == "16-true" || n == "16-mixed" || n == "64-true")) {
    throw ConfigError("[precision] '" + name + "' is not supported on xla yet; choose 32-true, bf16-mixed or "
                      "bf16-true");
  }
  if (n == "16-mixed" && device_type == "cuda") return Precision("16-mixed", c10::kHalf, device_type);
  if (n == "bf16-true" || n == "16-true" || n == "16-mixed" || n == "64-true") {
    throw ConfigError("[precision] '" + name + "' is not supported on " + device_type +
                      " yet; choose 32-true or bf16-mixed" + (device_type == "cuda" ? " or 16-mixed" : ""));
  }
  throw ConfigError("[precision] unknown precision '" + name +
                    "'; choose one of: 32-true, bf16-mixed (and 16-mixed on cuda)");
}

void Precision::convert_module(torch::nn::Module& module) const {
  if (param_dtype_ != c10::kFloat) module.to(param_dtype_);
}

namespace {
// The device type whose autocast state a precision sets: the xla device is
// PrivateUse1, whose autocast kernels the device registers (the CPU's
// policy, src/xla_device/autocast.cpp).
c10::DeviceType autocast_device(const std::string& device_type) {
  if (device_type == "cpu") return c10::kCPU;
  if (device_type == "xla") return c10::kPrivateUse1;
  return c10::kCUDA;
}
}  // namespace

// LibTorch 2's device-generic autocast state: one enabled flag and one
// dtype per device type.
Precision::ForwardContext::ForwardContext(const Precision& precision) {
  if (!precision.autocast()) return;
  active_ = true;
  device_type_ = precision.device_type_;
  const c10::DeviceType device = autocast_device(device_type_);
  was_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_dtype(device, precision.compute_dtype());
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

Precision::ForwardContext::~ForwardContext() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  const c10::DeviceType device = autocast_device(device_type_);
  at::autocast::set_autocast_enabled(device, was_enabled_);
  at::autocast::set_autocast_dtype(device, previous_dtype_);
}

}  // namespace strata::strategies
