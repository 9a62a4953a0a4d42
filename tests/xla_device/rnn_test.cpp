// LibTorch's recurrent modules on the xla device (Note [Fused cells as
// decompositions] in src/xla_device/kernels_rnn.cpp): LSTM, GRU, LSTMCell
// and GRUCell train three SGD steps beside their CPU twins, with the same
// losses and parameters, and no fallback; an op that neither a lowering nor
// a CPU kernel can run is refused by name. Skips, saying so, without the
// CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <cstdio>
#include <functional>
#include <string>

#include "strata/xla_device/device.h"
#include "strata/xla/error.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaRnnTest : public strata::testing::XlaDeviceFixture {};

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// `cpu_model` and a copy of it on `device` train `steps` SGD steps on the
// same batches; `loss` maps a model and a batch to its scalar loss. The
// losses agree to 1e-5 relative and the parameters to 1e-5 of their
// largest value (f32 sums in another order), and nothing falls back.
void train_beside_the_cpu(const std::shared_ptr<torch::nn::Module>& cpu_model,
                          const std::shared_ptr<torch::nn::Module>& xla_model, const c10::Device& device,
                          const std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>& loss,
                          const std::vector<int64_t>& batch_shape, int steps) {
  {
    torch::NoGradGuard no_grad;
    auto from = cpu_model->parameters();
    auto to = xla_model->parameters();
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  xla_model->to(device);
  torch::optim::SGD cpu_opt(cpu_model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD xla_opt(xla_model->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<at::Tensor> batches;
  for (int step = 0; step < steps; ++step) batches.push_back(torch::randn(batch_shape));
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  for (int step = 0; step < steps; ++step) {
    cpu_opt.zero_grad();
    at::Tensor cpu_loss = loss(*cpu_model, batches[step]);
    cpu_loss.backward();
    cpu_opt.step();
    xla_opt.zero_grad();
    at::Tensor xla_loss = loss(*xla_model, batches[step].to(device));
    xla_loss.backward();
    xla_opt.step();
    strata::xla::mark_step();
    const double want = cpu_loss.item<double>(), got = xla_loss.item<double>();
    std::printf("step %d loss: xla %.9g cpu %.9g\n", step, got, want);
    EXPECT_LE(relative(got, want), 1e-5) << "step " << step;
  }
  strata::testing::expect_parameters_close(*xla_model, *cpu_model, 1e-5);
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  EXPECT_EQ(m.executions, steps) << "one program per step";
}

TEST_F(XlaRnnTest, LstmTrainsLikeTheCpu) {
  torch::manual_seed(5);
  auto options = torch::nn::LSTMOptions(3, 5).num_layers(2).batch_first(true);
  auto cpu = torch::nn::LSTM(options), xla = torch::nn::LSTM(options);
  train_beside_the_cpu(
      cpu.ptr(), xla.ptr(), device_,
      [](torch::nn::Module& m, const at::Tensor& x) {
        auto [out, state] = dynamic_cast<torch::nn::LSTMImpl&>(m).forward(x);
        return out.pow(2).mean() + std::get<1>(state).sum();
      },
      {2, 4, 3}, 3);
}

TEST_F(XlaRnnTest, GruTrainsLikeTheCpu) {
  torch::manual_seed(6);
  auto options = torch::nn::GRUOptions(3, 4).num_layers(2);
  auto cpu = torch::nn::GRU(options), xla = torch::nn::GRU(options);
  train_beside_the_cpu(
      cpu.ptr(), xla.ptr(), device_,
      [](torch::nn::Module& m, const at::Tensor& x) {
        auto [out, h] = dynamic_cast<torch::nn::GRUImpl&>(m).forward(x);
        return out.pow(2).mean() + h.mean();
      },
      {4, 2, 3}, 3);
}

TEST_F(XlaRnnTest, LstmCellAndGruCellTrainLikeTheCpu) {
  torch::manual_seed(7);
  struct Cells : torch::nn::Module {
    Cells() {
      lstm = register_module("lstm", torch::nn::LSTMCell(torch::nn::LSTMCellOptions(3, 4)));
      gru = register_module("gru", torch::nn::GRUCell(torch::nn::GRUCellOptions(4, 2).bias(false)));
    }
    torch::nn::LSTMCell lstm{nullptr};
    torch::nn::GRUCell gru{nullptr};
  };
  auto cpu = std::make_shared<Cells>(), xla = std::make_shared<Cells>();
  train_beside_the_cpu(
      cpu, xla, device_,
      [](torch::nn::Module& m, const at::Tensor& x) {
        auto& cells = dynamic_cast<Cells&>(m);
        auto [h, c] = cells.lstm->forward(x);
        auto [h2, c2] = cells.lstm->forward(x * 0.5, std::make_tuple(h, c));
        at::Tensor g = cells.gru->forward(h2);
        return cells.gru->forward(h2, g).pow(2).sum() + c2.mean();
      },
      {3, 3}, 3);
}

TEST_F(XlaRnnTest, AnOpWithNoLoweringAndNoCpuKernelIsRefusedByName) {
  const at::Tensor cx = torch::randn({2, 3}).to(device_), workspace = torch::randn({2, 12}).to(device_);
  strata::xla::reset_metrics();
  try {
    (void)at::_thnn_fused_lstm_cell_backward_impl(cx, cx, cx, cx, workspace, true);
    FAIL() << "expected an XlaError";
  } catch (const strata::xla::XlaError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[xla] aten::_thnn_fused_lstm_cell_backward_impl has no lowering for the xla device, and LibTorch has "
              "no CPU kernel for it to fall back to (it is implemented for accelerators only); compute it from "
              "other ops, run it on the CPU with tensors moved there, or register a PrivateUse1 kernel for it");
  }
  EXPECT_EQ(metrics().fallback_calls(), 0) << "a refused op is not counted as run";
}

}  // namespace
