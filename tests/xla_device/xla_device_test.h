// What the xla device's test files share: a fixture that skips, saying
// why, without the CPU PJRT plugin of the project's environment and
// otherwise hands the test xla:0; and bf16 autocast on one device type for
// a scope, as the precision plugin's ForwardContext does for bf16-mixed.
#pragma once

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "strata/core/error.h"
#include "strata/xla/device.h"

namespace strata::testing {

class XlaDeviceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      strata::xla::find_plugin();
    } catch (const strata::ConfigError& e) {
      GTEST_SKIP() << "no PJRT plugin for the xla device: " << e.what();
    }
    strata::xla::init();
    device_ = strata::xla::device(0);
  }
  at::Tensor on(const at::Tensor& cpu) const { return cpu.to(device_); }
  c10::Device device_{c10::kCPU};
};

class Autocast {
 public:
  explicit Autocast(c10::DeviceType device) : device_(device) {
    was_enabled_ = at::autocast::is_autocast_enabled(device_);
    previous_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_dtype(device_, at::kBFloat16);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, previous_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_ = false;
  c10::ScalarType previous_ = at::kBFloat16;
};

}  // namespace strata::testing
