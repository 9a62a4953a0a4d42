// Precision plugins: how a strategy casts the module, runs forward and
// reduces gradients. "32-true" (fp32 everything) and "bf16-mixed" (fp32
// parameters and optimizer state, forward under bf16 autocast) on every
// device; "bf16-true" (the module, its gradients and the optimizer state
// in bf16, no autocast) on xla.
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <string>

namespace torch::nn {
class Module;
}

namespace strata::strategies {

/// A training precision.
class Precision {
 public:
  /// Parses "32-true" (also "32", "fp32"), "bf16-mixed", "bf16-true",
  /// "16-mixed" for `device_type` ("cpu", "cuda" or "xla"). Throws
  /// ConfigError for unknown names and for precisions this device does not
  /// support yet, listing the supported ones.
  static Precision parse(const std::string& name, const std::string& device_type = "cpu");

  /// The canonical name ("32-true", "bf16-mixed").
  const std::string& name() const { return name_; }
  /// dtype forward runs in under autocast (kFloat when no autocast).
  c10::ScalarType compute_dtype() const { return compute_dtype_; }
  /// True when forward should run under autocast.
  bool autocast() const { return compute_dtype_ != c10::kFloat && param_dtype_ == c10::kFloat; }
  /// dtype of the module's floating parameters (kBFloat16 for
  /// "bf16-true", kFloat otherwise).
  c10::ScalarType param_dtype() const { return param_dtype_; }
  /// Casts the module's floating parameters and buffers to param_dtype()
  /// (Lightning's convert_module); does nothing when that is kFloat.
  void convert_module(torch::nn::Module& module) const;

  /// RAII: enables autocast to compute_dtype() for the scope (forward), on
  /// the device type of this precision; does nothing for "32-true".
  class ForwardContext {
   public:
    explicit ForwardContext(const Precision& precision);
    ~ForwardContext();
    ForwardContext(const ForwardContext&) = delete;
    ForwardContext& operator=(const ForwardContext&) = delete;

   private:
    bool active_ = false;
    bool was_enabled_ = false;
    c10::ScalarType previous_dtype_ = c10::kBFloat16;
    std::string device_type_;
  };

 private:
  Precision(std::string name, c10::ScalarType compute, std::string device_type,
            c10::ScalarType param = c10::kFloat)
      : name_(std::move(name)), compute_dtype_(compute), param_dtype_(param), device_type_(std::move(device_type)) {}
  std::string name_;
  c10::ScalarType compute_dtype_;
  c10::ScalarType param_dtype_;
  std::string device_type_;
};

}  // namespace strata::strategies
