// The xla device: registration, storage, transfers and views, in-place
// writes, the generator, and the CPU fallback with its counters (ops
// without a lowering, which match the CPU bit for bit). The lazy graph's
// lowered ops and training are in lazy_test.cpp. Every test needs the CPU
// PJRT plugin of the project's environment and skips, saying so, without
// it.
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"
#include "strata/xla/error.h"
#include "support/errors.h"
#include "support/tool.h"
#include "support/worker.h"

namespace {

using strata::testing::error_message;

using strata::xla::metrics;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

class XlaDeviceTest : public strata::testing::XlaDeviceFixture {};

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && torch::equal(a, b);
}

TEST_F(XlaDeviceTest, DeviceIsPrivateUse1NamedXla) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "xla");
  EXPECT_EQ(device_.type(), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(torch::Device("xla:0"), device_);
  EXPECT_EQ(device_.str(), "xla:0");
  EXPECT_GE(strata::xla::device_count(), 1);
  EXPECT_THROW(strata::xla::device(strata::xla::device_count()), strata::ConfigError);
  at::Tensor x = torch::empty({2, 3}, torch::TensorOptions().device(device_));
  EXPECT_EQ(x.device(), device_);
  EXPECT_TRUE(x.is_privateuseone());
}

TEST_F(XlaDeviceTest, TensorsRoundTripThroughTheDeviceForF32Bf16AndI64) {
  strata::xla::reset_metrics();
  const at::Tensor f32 = torch::randn({5, 7});
  const at::Tensor bf16 = torch::randn({3, 4}).to(torch::kBFloat16);
  const at::Tensor i64 = torch::arange(-20, 20, torch::kLong).view({4, 10});
  for (const at::Tensor& cpu : {f32, bf16, i64}) {
    at::Tensor on_device = cpu.to(device_);
    EXPECT_EQ(on_device.device(), device_);
    EXPECT_EQ(on_device.scalar_type(), cpu.scalar_type());
    strata::xla::mark_step();  // drops the host copies: the next read downloads
    EXPECT_TRUE(same_bits(on_device.cpu(), cpu)) << cpu.scalar_type();
  }
  const auto m = metrics();
  EXPECT_EQ(m.host_to_device_count, 3);
  EXPECT_EQ(m.device_to_host_count, 3);
  EXPECT_EQ(m.host_to_device_bytes, 5 * 7 * 4 + 3 * 4 * 2 + 40 * 8);
  EXPECT_EQ(m.device_to_host_bytes, m.host_to_device_bytes);
  EXPECT_EQ(m.steps, 0) << "transfers record nothing, so the marks ran no step";
  EXPECT_EQ(m.fallback_calls(), 0) << "transfers run no fallback";

  // Casts on the way in, on the device and on the way out.
  at::Tensor as_bf16 = f32.to(device_, torch::kBFloat16);
  EXPECT_TRUE(same_bits(as_bf16.cpu(), f32.to(torch::kBFloat16)));
  EXPECT_TRUE(same_bits(as_bf16.to(torch::kFloat).cpu(), f32.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_TRUE(same_bits(i64.to(device_).to(torch::kCPU, torch::kDouble), i64.to(torch::kDouble)));
}

TEST_F(XlaDeviceTest, ViewsResolveAgainstTheirBasesStorage) {
  const at::Tensor cpu = torch::arange(24, torch::kFloat).view({4, 6});
  at::Tensor x = cpu.to(device_);
  strata::xla::mark_step();
  at::Tensor t = x.t();
  at::Tensor narrowed = x.narrow(1, 2, 3);
  at::Tensor row = x.select(0, 2);
  at::Tensor reshaped = x.view({6, 4});
  at::Tensor strided = x.as_strided({2, 2}, {7, 1}, 1);
  for (const at::Tensor& v : {t, narrowed, row, reshaped, strided})
    EXPECT_TRUE(v.is_alias_of(x)) << "a view shares its base's storage";
  EXPECT_TRUE(same_bits(t.cpu(), cpu.t()));
  EXPECT_TRUE(same_bits(narrowed.cpu(), cpu.narrow(1, 2, 3)));
  EXPECT_TRUE(same_bits(row.cpu(), cpu.select(0, 2)));
  EXPECT_TRUE(same_bits(reshaped.cpu(), cpu.view({6, 4})));
  EXPECT_TRUE(same_bits(strided.cpu(), cpu.as_strided({2, 2}, {7, 1}, 1)));
  EXPECT_TRUE(same_bits(t.contiguous().cpu(), cpu.t().contiguous()));
  EXPECT_TRUE(same_bits(x.reshape({3, 8}).cpu(), cpu.reshape({3, 8})));

  // resize_ grows the storage and keeps its bytes.
  at::Tensor grown = torch::arange(6, torch::kFloat).to(device_);
  grown.resize_({2, 5});
  EXPECT_TRUE(same_bits(grown.view({-1}).narrow(0, 0, 6).cpu(), torch::arange(6, torch::kFloat)));
  at::Tensor empty = torch::empty({0}, torch::TensorOptions().device(device_));
  at::_copy_from_and_resize(cpu, empty);
  EXPECT_TRUE(same_bits(empty.cpu(), cpu));
}

TEST_F(XlaDeviceTest, InPlaceOpsRebindTheTensorAndItsViews) {
  torch::manual_seed(3);
  at::Tensor cpu = torch::zeros({3, 4});
  at::Tensor x = torch::zeros({3, 4}, torch::TensorOptions().device(device_));
  x.add_(1);
  cpu.add_(1);
  at::Tensor view = x.narrow(1, 1, 2);
  view.mul_(5);
  cpu.narrow(1, 1, 2).mul_(5);
  EXPECT_TRUE(same_bits(x.cpu(), cpu));
  EXPECT_TRUE(same_bits(view.cpu(), cpu.narrow(1, 1, 2)));

  // A copy from the host into a view, and into a transposed view.
  const at::Tensor source = torch::randn({3, 2});
  view.copy_(source);
  cpu.narrow(1, 1, 2).copy_(source);
  x.t().select(0, 3).copy_(torch::full({3}, -2.0));
  cpu.t().select(0, 3).copy_(torch::full({3}, -2.0));
  strata::xla::mark_step();
  EXPECT_TRUE(same_bits(x.cpu(), cpu));

  // The old value of a rebound storage is untouched in a tensor copied
  // earlier.
  at::Tensor before = x.clone();
  x.zero_();
  EXPECT_TRUE(same_bits(before.cpu(), cpu));
  EXPECT_TRUE(same_bits(x.cpu(), torch::zeros({3, 4})));
  // The lowered sum adds in XLA's order, LibTorch's in its own: the two
  // agree to rounding of the sum of magnitudes.
  EXPECT_NEAR(before.sum().item<float>(), cpu.sum().item<float>(), 1e-6 * cpu.abs().sum().item<float>());
}

TEST_F(XlaDeviceTest, WritesToTwoViewsOfOneStorageFromTwoThreadsKeepBoth) {
  at::Tensor x = torch::zeros({2, 64}, torch::TensorOptions().device(device_));
  constexpr int kRounds = 40;
  auto bump = [&](int row, double by) {
    for (int i = 0; i < kRounds; ++i) x.select(0, row).add_(by);
  };
  std::thread first(bump, 0, 1.0);
  std::thread second(bump, 1, 2.0);
  first.join();
  second.join();
  at::Tensor expected = torch::stack({torch::full({64}, 1.0 * kRounds), torch::full({64}, 2.0 * kRounds)});
  EXPECT_TRUE(same_bits(x.cpu(), expected));
}

TEST_F(XlaDeviceTest, ManualSeedMakesRandomOpsReproducibleWithoutTouchingTheCpuStream) {
  const auto on_device = torch::TensorOptions().device(device_);
  torch::manual_seed(7);
  at::Tensor a = torch::randn({4, 5}, on_device).cpu();
  at::Tensor cpu_after = torch::randn({4, 5});
  torch::manual_seed(7);
  at::Tensor b = torch::randn({4, 5}, on_device).cpu();
  at::Tensor fresh_cpu = torch::randn({4, 5});
  EXPECT_TRUE(same_bits(a, b)) << "the same seed draws the same values";
  EXPECT_TRUE(same_bits(cpu_after, fresh_cpu)) << "drawing on xla leaves the CPU generator's stream alone";
  // Note [Generators on the host]: the device's generator is a CPU
  // generator, seeded alike.
  EXPECT_TRUE(same_bits(a, fresh_cpu));
  torch::manual_seed(8);
  EXPECT_FALSE(torch::equal(torch::randn({4, 5}, on_device).cpu(), a));
  at::Tensor u = torch::empty({100}, on_device).uniform_(-1, 1).cpu();
  EXPECT_LE(u.max().item<float>(), 1.0f);
  EXPECT_GE(u.min().item<float>(), -1.0f);
}

TEST_F(XlaDeviceTest, FallbackCountsEachOpByNameAndMatchesTheCpuBitwise) {
  // lgamma and digamma have no lowering: they run LibTorch's CPU kernels, so the
  // results are the CPU's bit for bit, also after a lowered op whose
  // pending value the fallback syncs first.
  const at::Tensor a_cpu = torch::randn({3, 3});
  const at::Tensor b_cpu = torch::randn({3, 3});
  at::Tensor a = a_cpu.to(device_);
  at::Tensor b = b_cpu.to(device_);
  strata::xla::reset_metrics();
  at::Tensor c = torch::lgamma(a);
  c = torch::digamma(c);
  at::Tensor d = torch::lgamma(b.neg());  // neg is lowered: pending when lgamma falls back
  const auto m = metrics();
  // Structured ops arrive as their out= kernels.
  EXPECT_EQ(m.fallbacks.at("aten::lgamma.out"), 2);
  EXPECT_EQ(m.fallbacks.at("aten::digamma.out"), 1);
  EXPECT_EQ(m.fallback_calls(), 3);
  EXPECT_EQ(m.lowered.at("aten::neg.out"), 1);
  EXPECT_EQ(m.executions, 1) << "the fallback ran the pending neg first";
  EXPECT_TRUE(same_bits(c.cpu(), torch::digamma(torch::lgamma(a_cpu))));
  EXPECT_TRUE(same_bits(d.cpu(), torch::lgamma(b_cpu.neg())));
}

TEST_F(XlaDeviceTest, FallbackErrorModeRefusesNamingTheOp) {
  at::Tensor a = torch::randn({4}).to(device_);
  ScopedEnv mode("STRATA_XLA_FALLBACK", "error");
  try {
    (void)torch::lgamma(a);
    FAIL() << "expected the fallback to be refused";
  } catch (const strata::xla::XlaError& e) {
    EXPECT_NE(std::string(e.what()).find("[xla] aten::lgamma.out has no lowering"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("STRATA_XLA_FALLBACK"), std::string::npos) << e.what();
  }
  // Transfers and views are no fallback: they still work.
  EXPECT_TRUE(same_bits(a.view({2, 2}).cpu(), a.cpu().view({2, 2})));
  ScopedEnv bad("STRATA_XLA_FALLBACK", "sometimes");
  EXPECT_THROW((void)torch::lgamma(a), strata::ConfigError);
}

TEST(XlaPluginTest, AMissingPluginPathIsNamed) {
  ScopedEnv plugin("STRATA_PJRT_PLUGIN", "/nonexistent/plugin.so");
  try {
    strata::xla::find_plugin();
    FAIL() << "expected ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("STRATA_PJRT_PLUGIN=/nonexistent/plugin.so"), std::string::npos)
        << e.what();
  }
}

// A process that registered another PrivateUse1 backend first.
STRATA_WORKER(xla_device_after_other_backend) {
  c10::register_privateuse1_backend("otherdev");
  try {
    strata::xla::init();
  } catch (const strata::ConfigError& e) {
    std::printf("%s\n", e.what());
    return strata::xla::is_initialized() ? 3 : 0;
  }
  return 2;
}

TEST(XlaRegistrationTest, AnotherPrivateUse1BackendIsRefused) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  auto outcome =
      strata::testing::finish(strata::testing::start_program({self, "--strata-worker=xla_device_after_other_backend"}));
  ASSERT_EQ(outcome.status, 0) << outcome.out << outcome.err;
  EXPECT_NE(outcome.out.find("[xla] this process already registered the PrivateUse1 device as 'otherdev'"),
            std::string::npos)
      << outcome.out;
}

// A process whose plugin speaks another PJRT C API version.
STRATA_WORKER(xla_device_with_old_plugin) {
  ::setenv("STRATA_PJRT_PLUGIN", STRATA_TEST_MOCK_PJRT_OLD, 1);
  try {
    strata::xla::init();
  } catch (const strata::xla::XlaError& e) {
    std::printf("%s\n", e.what());
    return strata::xla::is_initialized() ? 3 : 0;
  }
  return 2;
}

TEST(XlaPluginTest, APluginOfAnotherApiVersionIsRefusedNamingBothVersions) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  auto outcome =
      strata::testing::finish(strata::testing::start_program({self, "--strata-worker=xla_device_with_old_plugin"}));
  ASSERT_EQ(outcome.status, 0) << outcome.out << outcome.err;
  EXPECT_NE(outcome.out.find("plugin too old: the plugin has PJRT C API 0.50, strata was written against 0.81"),
            std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find(STRATA_TEST_MOCK_PJRT_OLD), std::string::npos) << "names the plugin: " << outcome.out;
}

TEST_F(XlaDeviceTest, ATensorOfAnotherDeviceInAnXlaOpIsRefusedNamingBoth) {
  const at::Tensor on_xla = torch::ones({3, 4}).to(device_);
  const at::Tensor on_cpu = torch::ones({3, 4});
  // Element-wise ops meet LibTorch's own check first (TensorIterator's),
  // which names both devices.
  for (const auto& op : std::vector<std::function<at::Tensor()>>{[&] { return on_xla + on_cpu; },
                                                                 [&] { return on_cpu * on_xla; }}) {
    const std::string message = error_message<c10::Error>(op);
    EXPECT_NE(message.find("Expected all tensors to be on the same device, but found at least two devices, xla:0 "
                           "and cpu"),
              std::string::npos)
        << message;
  }
  // The others reach the device's kernels, lowered or not, which refuse.
  const std::string lowered = error_message<strata::xla::XlaError>([&] { (void)torch::mm(on_xla, on_cpu.t()); });
  EXPECT_EQ(lowered, "[xla] aten::mm.out got a tensor on cpu (shape [4, 3]) beside tensors on the xla device; move "
                     "it there first (tensor.to(strata::xla::device())), or keep the op off the device");
  const std::string fallback =
      error_message<strata::xla::XlaError>([&] { (void)torch::dot(on_xla.flatten(), on_cpu.flatten()); });
  EXPECT_NE(fallback.find("[xla] aten::dot"), std::string::npos) << fallback;
  EXPECT_NE(fallback.find("got a tensor on cpu (shape [12]) beside tensors on the xla device"), std::string::npos)
      << fallback;
  // A 0-dim CPU tensor is a scalar, as on every device.
  EXPECT_TRUE(same_bits((on_xla * torch::full({}, 2.0)).cpu(), torch::full({3, 4}, 2.0)));
}

}  // namespace
