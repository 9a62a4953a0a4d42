// Accelerators: the kind of device a strategy trains on. Small objects a
// strategy is handed, as in Lightning: they name the device of each local
// rank and say how many there are.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace strata::strategies {

/// A kind of device.
class Accelerator {
 public:
  virtual ~Accelerator() = default;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;
  /// The device worker `local_rank` trains on.
  virtual c10::Device device(int local_rank) const = 0;
  /// How many workers to start on this host when the user asks for "auto".
  virtual int auto_device_count() const = 0;
};

/// Every worker on the CPU.
std::shared_ptr<Accelerator> cpu_accelerator();

/// Returns the accelerator called `name`: "cpu", "cuda", "gpu" (= cuda) or
/// "auto" (cuda when available, else cpu). "xla"/"tpu" and unavailable
/// devices are refused with a ConfigError that says what is supported.
std::shared_ptr<Accelerator> make_accelerator(const std::string& name);

}  // namespace strata::strategies
