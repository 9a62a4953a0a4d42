// The StableHLO builder's window ops (src/xla/stablehlo_window.cpp):
// convolution in the forms a convolution's forward and backward take
// (strided, padded low and high, dilated on either side, grouped, batch
// grouped, other dimension layouts), reduce_window (max, sum, base
// dilation), the variadic argmax of max pooling and reverse. Each case's
// text against a golden file (tests/xla/golden/window_<name>.mlir,
// STRATA_UPDATE_GOLDEN=1 rewrites them), then run on the CPU PJRT plugin
// and on JAX's CPU backend and compared with LibTorch on the host; then
// the operand checks.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "strata/xla/client.h"
#include "strata/xla/compile_options.h"
#include "support/errors.h"
#include "xla/torch_util.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<at::Tensor>;
using ConvDims = Function::ConvDims;
using ConvWindow = Function::ConvWindow;
using Window = Function::Window;
using Ints = std::vector<int64_t>;

struct WindowCase {
  std::string name;
  std::string module;
  std::vector<HostTensor> inputs;
  std::function<Tensors(const Tensors&)> reference;
};

const Type kF32{ElementType::kF32, {}};

// `x` with s - 1 zeros between its elements along each spatial dim (from 2).
at::Tensor dilated(const at::Tensor& x, int64_t s) {
  std::vector<int64_t> dims = x.sizes().vec();
  for (size_t d = 2; d < dims.size(); ++d) dims[d] = (dims[d] - 1) * s + 1;
  at::Tensor out = at::zeros(dims, x.options());
  at::Tensor view = out;
  for (int64_t d = 2; d < x.dim(); ++d) view = view.slice(d, 0, dims[static_cast<size_t>(d)], s);
  view.copy_(x);
  return out;
}

std::vector<WindowCase> window_cases() {
  std::vector<WindowCase> out;
  auto add = [&out](std::string name, const Function& f, std::vector<HostTensor> inputs,
                    std::function<Tensors(const Tensors&)> reference) {
    Module m("window_" + name);
    m.add(f);
    out.push_back({std::move(name), m.text(), std::move(inputs), std::move(reference)});
  };
  {
    // A 2-d convolution: stride, padding low and high, kernel dilation,
    // two feature groups; and a 1-d one with the input dilated (a
    // transposed convolution's form).
    const Type x{ElementType::kF32, {2, 4, 6, 7}}, w{ElementType::kF32, {6, 2, 3, 2}};
    const Type x1{ElementType::kF32, {1, 2, 4}}, w1{ElementType::kF32, {3, 2, 3}};
    Function f("main", {x, w, x1, w1});
    ConvWindow grouped;
    grouped.strides = {2, 1};
    grouped.padding_low = {1, 0};
    grouped.padding_high = {2, 1};
    grouped.rhs_dilation = {1, 2};
    grouped.feature_group_count = 2;
    ConvWindow dilated_input;
    dilated_input.lhs_dilation = {2};
    dilated_input.padding_low = {2};
    dilated_input.padding_high = {1};
    f.returns({f.convolution(f.arg(0), f.arg(1), ConvDims::channels_first(2), grouped),
               f.convolution(f.arg(2), f.arg(3), ConvDims::channels_first(1), dilated_input)});
    add("convolution", f, {f32({2, 4, 6, 7}, -2, 2), f32({6, 2, 3, 2}, -1, 1, 1), f32({1, 2, 4}, -1, 2, 2),
                           f32({3, 2, 3}, -1, 1, 3)},
        [](const Tensors& in) -> Tensors {
          const at::Tensor padded = at::constant_pad_nd(in[0], {0, 1, 1, 2});
          const at::Tensor spread = at::constant_pad_nd(dilated(in[2], 2), {2, 1});
          return {at::conv2d(padded, in[1], std::nullopt, Ints{2, 1}, Ints{0, 0}, Ints{1, 2}, 2), at::conv1d(spread, in[3])};
        });
  }
  {
    // A grouped convolution's weight gradient: the input's batch and
    // feature dims swapped, the output gradient as the kernel, the groups
    // as batch groups; the result is the weight's [O, I/g, K] layout.
    const Type x{ElementType::kF32, {2, 4, 5}}, gy{ElementType::kF32, {2, 6, 3}};
    Function f("main", {x, gy});
    ConvDims dims = ConvDims::channels_first(1);
    dims.input_batch = 1;
    dims.input_feature = 0;
    dims.kernel_input_feature = 0;
    dims.kernel_output_feature = 1;
    dims.output_batch = 1;
    dims.output_feature = 0;
    ConvWindow w;
    w.rhs_dilation = {2};
    w.padding_low = {1};
    w.padding_high = {1};
    w.batch_group_count = 2;
    f.returns({f.convolution(f.arg(0), f.arg(1), dims, w)});
    add("convolution_batch_groups", f, {f32({2, 4, 5}, -2, 2), f32({2, 6, 3}, -1, 1, 1)},
        [](const Tensors& in) -> Tensors {
          // The forward: stride 2, padding 1, kernel 3, two groups, 5 -> 2.
          const at::Tensor weight = at::zeros({6, 2, 3});
          const auto grads = at::convolution_backward(in[1], in[0], weight, std::nullopt, {2}, {1}, {1}, false, {0},
                                                      2, {false, true, false});
          return {std::get<1>(grads)};
        });
  }
  {
    // Pooling's windows: max with -inf padding and a dilated window, sum
    // at stride 2, sum over a base dilated by 2, the reversal of two dims.
    const Type x{ElementType::kF32, {2, 3, 5, 6}};
    Function f("main", {x});
    Window max;
    max.dimensions = {1, 1, 3, 2};
    max.strides = {1, 1, 2, 1};
    max.window_dilations = {1, 1, 1, 2};
    max.padding_low = {0, 0, 1, 0};
    max.padding_high = {0, 0, 1, 0};
    Window sum;
    sum.dimensions = {1, 1, 2, 3};
    sum.strides = {1, 1, 2, 3};
    Window spread;
    spread.dimensions = {1, 1, 2, 2};
    spread.base_dilations = {1, 1, 2, 2};
    const Value ninf = f.constant(kF32, {-std::numeric_limits<double>::infinity()});
    const Value zero = f.constant(kF32, {0.0});
    f.returns({f.reduce_window(f.arg(0), ninf, max, ReduceOp::kMax), f.reduce_window(f.arg(0), zero, sum, ReduceOp::kSum),
               f.reduce_window(f.arg(0), zero, spread, ReduceOp::kSum), f.reverse(f.arg(0), {1, 3})});
    add("reduce_window_reverse", f, {f32({2, 3, 5, 6}, -3, 3)}, [](const Tensors& in) -> Tensors {
      const at::Tensor& x = in[0];
      const at::Tensor ones = at::ones({3, 1, 2, 2});
      return {at::max_pool2d(x, {3, 2}, {2, 1}, {1, 0}, {1, 2}),
              at::avg_pool2d(x, {2, 3}, {2, 3}, {0, 0}, false, true, 1),
              at::conv2d(dilated(x, 2), ones, std::nullopt, Ints{1, 1}, Ints{0, 0}, Ints{1, 1}, 3),
              x.flip({1, 3})};
    });
  }
  {
    // Max pooling's (max, index) pairs: ties go to the first index, the
    // padding never wins, not even over a plane of -inf (made in the
    // program: JSON has no inf to feed it), as in LibTorch's
    // max_pool2d_with_indices.
    Function f("main", {Type{ElementType::kF32, {1, 1, 4, 5}}});
    const Value ninf = f.constant(Type{ElementType::kF32, {1, 1, 4, 5}}, {-std::numeric_limits<double>::infinity()});
    const Value x = f.concatenate({f.arg(0), ninf}, 1);
    const Value plane = f.reshape(f.iota(Type{ElementType::kS64, {20}}, 0), {4, 5});
    const Value index = f.broadcast_in_dim(plane, {1, 2, 4, 5}, {2, 3});
    Window w;
    w.dimensions = {1, 1, 3, 3};
    w.strides = {1, 1, 2, 2};
    w.padding_low = {0, 0, 1, 1};
    w.padding_high = {0, 0, 1, 1};
    const std::vector<Value> pairs = f.reduce_window_argmax(x, index, w);
    f.returns({pairs[0], pairs[1]});
    HostTensor values{ElementType::kF32, {1, 1, 4, 5}, {}};
    for (int i = 0; i < 20; ++i) values.values.push_back(i % 7 == 3 ? 2.0 : (i % 3) - 1.0);  // ties
    add("reduce_window_argmax", f, {values}, [](const Tensors& in) -> Tensors {
      const at::Tensor x = at::cat({in[0], at::full({1, 1, 4, 5}, -std::numeric_limits<double>::infinity())}, 1);
      const auto [max, indices] = at::max_pool2d_with_indices(x, {3, 3}, {2, 2}, {1, 1});
      return {max, indices};
    });
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Tensors host_tensors(const std::vector<HostTensor>& inputs) {
  Tensors out;
  for (const HostTensor& h : inputs) out.push_back(to_tensor(h));
  return out;
}

void expect_outputs(const Tensors& got, const Tensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < want.size(); ++o) expect_same(got[o], want[o], what + " output " + std::to_string(o));
}

TEST(StablehloWindowTest, CasesMatchGoldenFiles) {
  const bool update = std::getenv("STRATA_UPDATE_GOLDEN") != nullptr;
  const auto cases = window_cases();
  const auto again = window_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(cases[i].module, again[i].module) << "the same calls print the same text";
    const std::string path = xla_test_file("golden/window_" + cases[i].name + ".mlir");
    if (update) std::ofstream(path) << cases[i].module;
    const std::string golden = read_text(path);
    ASSERT_FALSE(golden.empty()) << path << " is missing; run with STRATA_UPDATE_GOLDEN=1 to write it";
    EXPECT_EQ(cases[i].module, golden);
  }
}

TEST(StablehloWindowTest, CpuPluginRunsEveryCaseAsLibTorchDoes) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  const xla::Client client = xla::Client::create(xla::Plugin::load(cpu_plugin_path()));
  const xla::Device device = client.addressable_devices().at(0);
  for (const WindowCase& c : window_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<xla::Buffer> buffers;
    std::vector<const xla::Buffer*> args;
    for (const HostTensor& h : c.inputs) {
      const at::Tensor t = to_tensor(h).contiguous();
      buffers.push_back(client.buffer_from_host(t.data_ptr(), t.nbytes(), h.dtype, h.dims, device));
    }
    for (const xla::Buffer& b : buffers) args.push_back(&b);
    const auto results = client.compile(c.module, xla::CompileOptions()).execute({args});
    Tensors got;
    for (const xla::Buffer& b : results.at(0)) got.push_back(to_tensor(b));
    expect_outputs(got, c.reference(host_tensors(c.inputs)), c.name);
  }
}

TEST(StablehloWindowTest, JaxRunsEveryCaseAsLibTorchDoes) {
  const std::string python = test_python();
  if (python.empty()) GTEST_SKIP() << "STRATA_PYTHON is not set: no Python to run jax with";
  const auto cases = window_cases();
  const fs::path dir = fs::temp_directory_path() / ("strata-xla-window-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json request = {{"cases", nlohmann::json::array()}};
  for (const WindowCase& c : cases) {
    nlohmann::json args = nlohmann::json::array();
    for (const HostTensor& h : c.inputs)
      args.push_back({{"dtype", std::string(xla::stablehlo_name(h.dtype))}, {"dims", h.dims}, {"values", h.values}});
    request["cases"].push_back(
        {{"name", c.name}, {"module", c.module}, {"replicas", 1}, {"inputs", nlohmann::json::array({args})}});
  }
  std::ofstream(dir / "request.json") << request.dump();
  std::string output;
  const std::string command = python + " " + xla_test_file("jax_oracle.py") + " " + (dir / "request.json").string() +
                              " " + (dir / "result.json").string() + " 2>&1";
  ASSERT_EQ(run_command(command, output), 0) << output;
  std::ifstream in(dir / "result.json");
  const nlohmann::json result = nlohmann::json::parse(in);
  fs::remove_all(dir);
  if (result.contains("skip")) GTEST_SKIP() << result["skip"].get<std::string>();
  ASSERT_EQ(result["cases"].size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const nlohmann::json& got = result["cases"][i];
    ASSERT_FALSE(got.contains("error")) << got["error"];
    Tensors outputs;
    for (const nlohmann::json& o : got["outputs"][0]) outputs.push_back(tensor_from_json(o));
    expect_outputs(outputs, cases[i].reference(host_tensors(cases[i].inputs)), cases[i].name);
  }
}

TEST(StablehloWindowTest, WindowOpsRejectBadOperands) {
  Function f("main", {Type{ElementType::kF32, {2, 4, 5}}, Type{ElementType::kF32, {6, 3, 2}},
                      Type{ElementType::kBF16, {6, 2, 2}}, Type{ElementType::kS32, {2, 4, 5}}});
  const Value x = f.arg(0), w = f.arg(1), bf = f.arg(2), ints = f.arg(3);
  auto message = [](auto fn) { return error_message<ConfigError>(fn); };
  EXPECT_EQ(message([&] { f.convolution(x, w, ConvDims::channels_first(2), {}); }),
            "[stablehlo] convolution: 2 spatial dims need an input and a kernel of rank 4, got tensor<2x4x5xf32> "
            "and tensor<6x3x2xf32>");
  EXPECT_EQ(message([&] { f.convolution(x, w, ConvDims::channels_first(1), {}); }),
            "[stablehlo] convolution: input features 4 in 1 groups do not match the kernel's input features 3");
  EXPECT_EQ(message([&] { f.convolution(x, bf, ConvDims::channels_first(1), {}); }),
            "[stablehlo] convolution: input tensor<2x4x5xf32> and kernel tensor<6x2x2xbf16> differ in element type");
  ConvWindow strides;
  strides.strides = {1, 1};
  EXPECT_EQ(message([&] { f.convolution(x, f.slice(w, {0, 0, 0}, {6, 2, 2}), ConvDims::channels_first(1), strides); }),
            "[stablehlo] convolution: window_strides [1, 1] needs 1 entries");
  Window window;
  window.dimensions = {1, 2};
  EXPECT_EQ(message([&] { f.reduce_window(x, f.constant(kF32, {0.0}), window, ReduceOp::kSum); }),
            "[stablehlo] reduce_window: tensor<2x4x5xf32> needs 3 window dimensions, got [1, 2]");
  window.dimensions = {1, 0, 2};
  EXPECT_EQ(message([&] { f.reduce_window(x, f.constant(kF32, {0.0}), window, ReduceOp::kSum); }),
            "[stablehlo] reduce_window: window_dimensions [1, 0, 2] must be positive");
  window.dimensions = {1, 2, 2};
  EXPECT_EQ(message([&] { f.reduce_window(x, f.constant(Type{ElementType::kF32, {1}}, {0.0}), window, ReduceOp::kSum); }),
            "[stablehlo] reduce_window: the initial value must be a tensor<f32>, got tensor<1xf32>");
  EXPECT_EQ(message([&] { f.reduce_window_argmax(x, x, window); }),
            "[stablehlo] reduce_window_argmax: the indices must be integers of the values' dims [2, 4, 5], got "
            "tensor<2x4x5xf32>");
  EXPECT_EQ(message([&] { f.reduce_window_argmax(ints, ints, window); }),
            "[stablehlo] reduce_window_argmax: needs float values, got tensor<2x4x5xi32>");
  EXPECT_EQ(message([&] { f.reverse(x, {3}); }), "[stablehlo] reverse: dimension 3 is out of range for rank 3");
}

}  // namespace
}  // namespace strata::testing
