// What the xla device's test files share: a fixture that skips, saying
// why, without the CPU PJRT plugin of the project's environment and
// otherwise hands the test xla:0; and bf16 autocast on one device type for
// a scope, as the precision plugin's ForwardContext does for bf16-mixed;
// the small MLP the tests train; and the check that a model trained on xla
// ended where its CPU twin did.
#pragma once

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

#include "strata/core/error.h"
#include "strata/xla_device/device.h"

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

/// A 6-16-3 MLP with a ReLU.
struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

/// Each parameter of `xla_model` within `tol` times the largest |value| of
/// the same parameter of `cpu_model`; prints each difference.
inline void expect_parameters_close(torch::nn::Module& xla_model, torch::nn::Module& cpu_model, double tol) {
  auto cpu_params = cpu_model.named_parameters();
  for (const auto& item : xla_model.named_parameters()) {
    const at::Tensor& want = cpu_params[item.key()];
    const double diff = (item.value().cpu() - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    std::printf("%s: max difference %.3g, relative to max |p| %.3g\n", item.key().c_str(), diff, diff / scale);
    EXPECT_LE(diff, tol * scale) << item.key();
  }
}

}  // namespace strata::testing
