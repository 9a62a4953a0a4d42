// The fused recurrent cells on the xla device: `_thnn_fused_lstm_cell` and
// `_thnn_fused_gru_cell` computed from ATen ops, so that torch::nn::LSTM,
// GRU, LSTMCell and GRUCell run and train there.
//
// Note [Fused cells as decompositions]
// LibTorch's RNN.cpp computes a cell with the fused kernels on every
// device that is not the CPU (`input.is_privateuseone()` among them), and
// those have CUDA kernels only: the CPU fallback would find nothing to run.
// The xla device registers a kernel of its own for each, on
// AutogradPrivateUse1, that computes the cell from the ATen ops the CPU's
// unfused cell uses (sigmoid, tanh, products and sums of the gates).
// Autograd records those ops, so the backward is theirs, and the fused
// backward kernels (CUDA's `_thnn_fused_*_backward_impl`) are never
// reached. The same kernel on PrivateUse1 serves calls below autograd
// (inference mode). The gates are added as the CUDA kernel adds them,
// (input gates + hidden gates) + biases; the CPU's cell adds each bias
// inside its matrix product, so results agree to a rounding of the sums.
// The third (workspace) output is opaque to callers: it holds the gates'
// sum, detached.
#include <ATen/ops/chunk.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// gates + bias, where a bias is given.
at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return given(bias) ? gates + *bias : gates;
}

// Note [Fused cells as decompositions]: i, f, g, o gates of
// input_gates + hidden_gates (+ biases); cy = f * cx + i * g,
// hy = o * tanh(cy).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = with_bias(with_bias(input_gates + hidden_gates, input_bias), hidden_bias);
  const int64_t dim = gates.dim() - 1;
  std::vector<at::Tensor> chunks = gates.chunk(4, dim);
  const at::Tensor in = chunks[0].sigmoid(), forget = chunks[1].sigmoid(), cell = chunks[2].tanh(),
                   out = chunks[3].sigmoid();
  at::Tensor cy = forget * cx + in * cell;
  at::Tensor hy = out * cy.tanh();
  return {hy, cy, gates.detach()};
}

// Note [Fused cells as decompositions]: r, z, n gates as the CPU's GRU
// cell computes them; hy = (hx - n) * z + n.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor input = with_bias(input_gates, input_bias), hidden = with_bias(hidden_gates, hidden_bias);
  const int64_t dim = input.dim() - 1;
  std::vector<at::Tensor> ic = input.chunk(3, dim), hc = hidden.chunk(3, dim);
  const at::Tensor reset = (hc[0] + ic[0]).sigmoid(), update = (hc[1] + ic[1]).sigmoid();
  const at::Tensor fresh = (ic[2] + hc[2] * reset).tanh();
  at::Tensor hy = (hx - fresh) * update + fresh;
  return {hy, hidden.detach()};
}

}  // namespace

void register_rnn(torch::Library& library) {
  library.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  library.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  // Note [Registered at init, not at load] (runtime.cpp): this library
  // lives for the rest of the process.
  static auto* autograd =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  autograd->impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  autograd->impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

}  // namespace strata::xla::detail::lowering
