// The StableHLO builder's indexing, element-wise and multi-result ops:
// each case's text against a golden file (tests/xla/golden/ops_<name>.mlir,
// STRATA_UPDATE_GOLDEN=1 rewrites them), then run on the CPU PJRT plugin and
// on JAX's CPU backend and compared with LibTorch on the host. Then the
// operand checks, erf against std::erf over a wide range, random bits
// reproducible from their key, and argument donation.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "strata/xla/client.h"
#include "strata/xla/compile_options.h"
#include "strata/xla/error.h"
#include "support/errors.h"
#include "xla/torch_util.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using xla::stablehlo::FftType;
using xla::stablehlo::GatherDims;
using xla::stablehlo::RngAlgorithm;
using Tensors = std::vector<at::Tensor>;

struct OpCase {
  std::string name;
  std::string module;
  std::vector<HostTensor> inputs;
  std::function<Tensors(const Tensors&)> reference;
};

HostTensor ints(ElementType dtype, std::vector<int64_t> dims, std::vector<double> values) {
  return {dtype, std::move(dims), std::move(values)};
}

const Type kF32{ElementType::kF32, {}};
const Type kS32{ElementType::kS32, {}};

std::vector<OpCase> op_cases() {
  std::vector<OpCase> out;
  auto add = [&out](std::string name, const Function& f, std::vector<HostTensor> inputs,
                    std::function<Tensors(const Tensors&)> reference) {
    Module m("ops_" + name);
    m.add(f);
    out.push_back({std::move(name), m.text(), std::move(inputs), std::move(reference)});
  };
  const Type m23{ElementType::kF32, {2, 3}};
  {
    Function f("main", {m23, m23});
    const Value a = f.arg(0), p = f.arg(1);  // p > 0
    const Value inf_or_nan = f.divide(a, f.constant(m23, {0.0}));
    f.returns({f.power(p, a), f.remainder(a, p), f.sign(a), f.floor(a), f.ceil(a), f.round_nearest_even(a),
               f.logistic(a), f.log_plus_one(p), f.exponential_minus_one(a), f.erf(a),
               f.clamp(f.constant(kF32, {-1.0}), a, f.constant(kF32, {1.25})), f.is_finite(inf_or_nan),
               f.is_finite(a), f.sine(a), f.cosine(a)});
    add("elementwise", f, {f32({2, 3}, -2.5, 2.5), f32({2, 3}, 0.25, 4, 1)}, [](const Tensors& x) -> Tensors {
      return {at::pow(x[1], x[0]),
              at::fmod(x[0], x[1]),
              at::sign(x[0]),
              at::floor(x[0]),
              at::ceil(x[0]),
              at::round(x[0]),
              at::sigmoid(x[0]),
              at::log1p(x[1]),
              at::expm1(x[0]),
              at::erf(x[0]),
              at::clamp(x[0], -1.0, 1.25),
              at::isfinite(x[0] / 0.0),
              at::isfinite(x[0]),
              at::sin(x[0]),
              at::cos(x[0])};
    });
  }
  {
    // The transforms' complex values leave the program as their parts.
    const Type m38{ElementType::kF32, {3, 8}};
    Function f("main", {m38, m38});
    const Value spectrum = f.fft(f.arg(0), FftType::kRealForward, {8});
    const Value c = f.complex(f.arg(0), f.arg(1));
    const Value both = f.fft(c, FftType::kForward, {3, 8}), inverse = f.fft(c, FftType::kInverse, {8});
    f.returns({f.real(spectrum), f.imag(spectrum), f.real(both), f.imag(both), f.real(inverse), f.imag(inverse),
               f.fft(spectrum, FftType::kRealInverse, {8})});
    add("fft", f, {f32({3, 8}, -2, 3), f32({3, 8}, 1, -1)}, [](const Tensors& x) -> Tensors {
      const at::Tensor spectrum = at::fft_rfft(x[0]), c = at::complex(x[0], x[1]);
      const at::Tensor both = at::fft_fft2(c), inverse = at::fft_ifft(c);
      return {at::real(spectrum).contiguous(), at::imag(spectrum).contiguous(), at::real(both).contiguous(),
              at::imag(both).contiguous(),     at::real(inverse).contiguous(),  at::imag(inverse).contiguous(),
              at::fft_irfft(spectrum, 8)};
    });
  }
  {
    const Type b4{ElementType::kPred, {4}}, i4{ElementType::kS32, {4}};
    Function f("main", {b4, b4, i4, i4});
    f.returns({f.logical_and(f.arg(0), f.arg(1)), f.logical_or(f.arg(0), f.arg(1)),
               f.logical_xor(f.arg(0), f.arg(1)), f.logical_not(f.arg(0)), f.logical_and(f.arg(2), f.arg(3)),
               f.logical_or(f.arg(2), f.arg(3)), f.shift_right_logical(f.arg(2), f.constant(i4, {1})),
               f.remainder(f.arg(2), f.arg(3))});
    add("logical", f,
        {ints(ElementType::kPred, {4}, {0, 1, 0, 1}), ints(ElementType::kPred, {4}, {0, 0, 1, 1}),
         ints(ElementType::kS32, {4}, {12, 7, 255, 1024}), ints(ElementType::kS32, {4}, {10, 3, 15, 7})},
        [](const Tensors& x) -> Tensors {
          return {x[0].logical_and(x[1]),           x[0].logical_or(x[1]),
                  x[0].logical_xor(x[1]),           x[0].logical_not(),
                  x[2].bitwise_and(x[3]),           x[2].bitwise_or(x[3]),
                  at::bitwise_right_shift(x[2], 1), at::fmod(x[2], x[3])};
        });
  }
  {
    const Type m34{ElementType::kF32, {3, 4}};
    Function f("main", {m34});
    const Value x = f.arg(0);
    f.returns({f.iota(Type{ElementType::kS32, {2, 3}}, 1), f.iota(Type{ElementType::kF32, {2, 3}}, 0),
               f.slice(x, {0, 1}, {3, 4}, {2, 2}), f.slice(x, {1, 0}, {2, 4}),
               f.concatenate({x, f.slice(x, {0, 0}, {3, 1})}, 1), f.concatenate({x, x}, 0),
               f.pad(x, f.constant(kF32, {0.5}), {1, -1}, {0, 2}, {1, 0})});
    add("iota_slice_concatenate_pad", f, {f32({3, 4}, -3, 3)}, [](const Tensors& in) -> Tensors {
      const at::Tensor& x = in[0];
      at::Tensor interior = at::full({5, 4}, 0.5, at::kFloat);
      interior.slice(0, 0, 5, 2).copy_(x);
      return {at::arange(3, at::kInt).expand({2, 3}).contiguous(),
              at::arange(2, at::kFloat).unsqueeze(1).expand({2, 3}).contiguous(),
              x.slice(0, 0, 3, 2).slice(1, 1, 4, 2).contiguous(),
              x.slice(0, 1, 2).contiguous(),
              at::cat({x, x.slice(1, 0, 1)}, 1),
              at::cat({x, x}, 0),
              at::constant_pad_nd(interior, {-1, 2, 1, 0}, 0.5)};
    });
  }
  {
    Function f("main", {Type{ElementType::kF32, {4, 5}}, Type{ElementType::kF32, {2, 2}}, kS32, kS32});
    const Value x = f.arg(0), u = f.arg(1), i = f.arg(2), j = f.arg(3);
    // j = 3 with a slice of 3 columns: XLA clamps the start to 2.
    f.returns({f.dynamic_slice(x, {i, j}, {2, 3}), f.dynamic_update_slice(x, u, {i, j})});
    add("dynamic_slice", f,
        {f32({4, 5}, -4, 4), f32({2, 2}, 10, 13), ints(ElementType::kS32, {}, {1}),
         ints(ElementType::kS32, {}, {3})},
        [](const Tensors& x) -> Tensors {
          at::Tensor updated = x[0].clone();
          updated.slice(0, 1, 3).slice(1, 3, 5).copy_(x[1]);
          return {x[0].slice(0, 1, 3).slice(1, 2, 5).contiguous(), updated};
        });
  }
  {
    const Type table{ElementType::kF32, {5, 3}}, cube{ElementType::kF32, {2, 4, 3}};
    Function f("main", {table, Type{ElementType::kS32, {2, 2}}, cube, Type{ElementType::kS64, {3}}, kS32});
    f.returns({f.take_rows(f.arg(0), f.arg(1)), f.take_rows(f.arg(2), f.arg(3), 1),
               f.take_rows(f.arg(0), f.arg(4))});
    add("take_rows", f,
        {f32({5, 3}, -2, 2), ints(ElementType::kS32, {2, 2}, {4, 0, 2, 4}), f32({2, 4, 3}, -1, 5, 1),
         ints(ElementType::kS64, {3}, {3, 1, 1}), ints(ElementType::kS32, {}, {2})},
        [](const Tensors& x) -> Tensors {
          return {x[0].index_select(0, x[1].flatten()).reshape({2, 2, 3}), x[2].index_select(1, x[3]),
                  x[0].select(0, 2)};
        });
  }
  {
    // torch.gather along dim 1 (take_along_axis): row i of the operand and
    // row i of the indices are one batch.
    Function f("main", {Type{ElementType::kF32, {3, 4}}, Type{ElementType::kS32, {3, 2, 1}}});
    GatherDims dims;
    dims.collapsed_slice_dims = {1};
    dims.operand_batching_dims = {0};
    dims.start_indices_batching_dims = {0};
    dims.start_index_map = {1};
    dims.index_vector_dim = 2;
    f.returns({f.gather(f.arg(0), f.arg(1), dims, {1, 1})});
    add("gather_batched", f, {f32({3, 4}, -3, 3), ints(ElementType::kS32, {3, 2, 1}, {3, 0, 1, 1, 2, 3})},
        [](const Tensors& x) -> Tensors { return {at::gather(x[0], 1, x[1].squeeze(2).to(at::kLong))}; });
  }
  {
    // Embedding backward: gradient rows scatter-added into a zero table
    // (repeated indices accumulate), and the same along dim 1.
    Function f("main", {Type{ElementType::kS32, {2, 3}}, Type{ElementType::kF32, {2, 3, 4}},
                        Type{ElementType::kF32, {2, 3}}, Type{ElementType::kS64, {4}},
                        Type{ElementType::kF32, {2, 4}}});
    const Value table = f.constant(Type{ElementType::kF32, {5, 4}}, {0.0});
    f.returns(
        {f.scatter_add_rows(table, f.arg(0), f.arg(1)), f.scatter_add_rows(f.arg(2), f.arg(3), f.arg(4), 1)});
    add("scatter_add_rows", f,
        {ints(ElementType::kS32, {2, 3}, {1, 4, 1, 0, 1, 3}), f32({2, 3, 4}, -2, 3), f32({2, 3}, 0, 1, 1),
         ints(ElementType::kS64, {4}, {2, 0, 2, 2}), f32({2, 4}, -1, 1, 2)},
        [](const Tensors& x) -> Tensors {
          const at::Tensor grads =
              at::zeros({5, 4}, at::kFloat).index_add(0, x[0].flatten().to(at::kLong), x[1].reshape({6, 4}));
          return {grads, x[2].index_add(1, x[3], x[4])};
        });
  }
  {
    Function f("main", {Type{ElementType::kF32, {3, 5}}, Type{ElementType::kS32, {2}}});
    const std::vector<Value> kept = f.optimization_barrier({f.arg(0), f.arg(1)});
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> nans(15, 0.0);
    nans[7] = nan;  // row 1 has a nan, which wins
    const Value with_nan = f.add(kept[0], f.constant(kept[0].type, nans));
    const std::vector<Value> max = f.argmax(with_nan, 1);
    const std::vector<Value> max_i32 = f.argmax(f.convert(kept[0], ElementType::kS32), 0, ElementType::kS32);
    f.returns({kept[0], kept[1], max[0], max[1], max_i32[0], max_i32[1]});
    add("barrier_argmax", f,
        {{ElementType::kF32, {3, 5}, {1, 4, 4, -2, 0, 3, 3, 1, 9, 3, -1, -1, -1, -1, -1}},
         ints(ElementType::kS32, {2}, {7, -7})},
        [nan](const Tensors& x) -> Tensors {
          at::Tensor with_nan = x[0].clone();
          with_nan[1][2] = nan;
          const auto [values, indices] = at::max(with_nan, 1);
          const auto [values_i, indices_i] = at::max(x[0].to(at::kInt), 0);
          return {x[0], x[1], values, indices, values_i, indices_i.to(at::kInt)};
        });
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json host_json(const HostTensor& h) {
  return {{"dtype", std::string(xla::stablehlo_name(h.dtype))}, {"dims", h.dims}, {"values", h.values}};
}

at::Tensor tensor_from_json(const nlohmann::json& j) {
  HostTensor h{
      element_type_named(j.at("dtype").get<std::string>()), j.at("dims").get<std::vector<int64_t>>(), {}};
  for (const nlohmann::json& v : j.at("values"))
    h.values.push_back(v.is_string() ? std::stod(v.get<std::string>()) : v.get<double>());
  return to_tensor(h);
}

/// Runs single-device modules on JAX's CPU backend (tests/xla/jax_oracle.py):
/// outputs per case, or a skip reason in `skip`.
std::vector<nlohmann::json> run_on_jax(
    const std::vector<std::pair<std::string, std::vector<HostTensor>>>& cases, std::string& skip) {
  const std::string python = test_python();
  if (python.empty()) {
    skip = "STRATA_PYTHON is not set: no Python to run jax with";
    return {};
  }
  const fs::path dir = fs::temp_directory_path() / ("strata-xla-ops-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json request = {{"cases", nlohmann::json::array()}};
  for (size_t i = 0; i < cases.size(); ++i) {
    nlohmann::json args = nlohmann::json::array();
    for (const HostTensor& h : cases[i].second) args.push_back(host_json(h));
    request["cases"].push_back({{"name", std::to_string(i)},
                                {"module", cases[i].first},
                                {"replicas", 1},
                                {"inputs", nlohmann::json::array({args})}});
  }
  std::ofstream(dir / "request.json") << request.dump();
  std::string output;
  const int rc =
      run_command(python + " " + xla_test_file("jax_oracle.py") + " " + (dir / "request.json").string() +
                      " " + (dir / "result.json").string() + " 2>&1",
                  output);
  EXPECT_EQ(rc, 0) << output;
  std::ifstream in(dir / "result.json");
  const nlohmann::json result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  fs::remove_all(dir);
  if (result.is_discarded()) {
    ADD_FAILURE() << "the oracle wrote no result: " << output;
    return {};
  }
  if (result.contains("skip")) {
    skip = result["skip"].get<std::string>();
    return {};
  }
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& c : result["cases"]) {
    EXPECT_FALSE(c.contains("error")) << "case " << c["name"] << ": " << c["error"];
    out.push_back(c.contains("outputs") ? c["outputs"][0] : nlohmann::json::array());
  }
  return out;
}

/// A one-device client of the CPU plugin (the caller skips without one).
struct PluginRun {
  PluginRun() : client(xla::Client::create(xla::Plugin::load(cpu_plugin_path()))) {
    device = client.addressable_devices().at(0);
  }
  xla::Buffer upload(const HostTensor& h) const {
    const at::Tensor t = to_tensor(h).contiguous();
    return client.buffer_from_host(t.data_ptr(), t.nbytes(), h.dtype, h.dims, device);
  }
  std::vector<xla::Buffer> run(const std::string& module, const std::vector<const xla::Buffer*>& args) const {
    return std::move(client.compile(module, xla::CompileOptions()).execute({args})[0]);
  }
  Tensors run_host(const std::string& module, const std::vector<HostTensor>& inputs) const {
    std::vector<xla::Buffer> buffers;
    std::vector<const xla::Buffer*> args;
    for (const HostTensor& h : inputs) buffers.push_back(upload(h));
    for (const xla::Buffer& b : buffers) args.push_back(&b);
    Tensors out;
    for (const xla::Buffer& b : run(module, args)) out.push_back(to_tensor(b));
    return out;
  }
  xla::Client client;
  xla::Device device;
};

Tensors host_tensors(const std::vector<HostTensor>& inputs) {
  Tensors out;
  for (const HostTensor& h : inputs) out.push_back(to_tensor(h));
  return out;
}

void expect_outputs(const Tensors& got, const Tensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < want.size(); ++o)
    expect_same(got[o], want[o], what + " output " + std::to_string(o));
}

TEST(StablehloOpsTest, CasesMatchGoldenFiles) {
  const bool update = std::getenv("STRATA_UPDATE_GOLDEN") != nullptr;
  const auto cases = op_cases();
  const auto again = op_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(cases[i].module, again[i].module) << "the same calls print the same text";
    const std::string path = xla_test_file("golden/ops_" + cases[i].name + ".mlir");
    if (update) std::ofstream(path) << cases[i].module;
    const std::string golden = read_file(path);
    ASSERT_FALSE(golden.empty()) << path << " is missing; run with STRATA_UPDATE_GOLDEN=1 to write it";
    EXPECT_EQ(cases[i].module, golden);
  }
}

TEST(StablehloOpsTest, CpuPluginRunsEveryCaseAsLibTorchDoes) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  const PluginRun plugin;
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.name);
    expect_outputs(plugin.run_host(c.module, c.inputs), c.reference(host_tensors(c.inputs)), c.name);
  }
}

TEST(StablehloOpsTest, JaxRunsEveryCaseAsLibTorchDoes) {
  const auto cases = op_cases();
  std::vector<std::pair<std::string, std::vector<HostTensor>>> request;
  for (const OpCase& c : cases) request.emplace_back(c.module, c.inputs);
  std::string skip;
  const std::vector<nlohmann::json> outputs = run_on_jax(request, skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_EQ(outputs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    Tensors got;
    for (const nlohmann::json& o : outputs[i]) got.push_back(tensor_from_json(o));
    expect_outputs(got, cases[i].reference(host_tensors(cases[i].inputs)), cases[i].name);
  }
}

TEST(StablehloOpsTest, OpsRejectBadOperands) {
  Function f("main", {Type{ElementType::kF32, {5, 3}}, Type{ElementType::kF32, {2, 2}},
                      Type{ElementType::kS32, {2, 2}}, Type{ElementType::kPred, {2}}});
  const Value table = f.arg(0), floats = f.arg(1), idx = f.arg(2);
  auto message = [](auto fn) { return error_message<ConfigError>(fn); };
  EXPECT_EQ(message([&] { f.floor(idx); }), "[stablehlo] floor: needs a float operand, got tensor<2x2xi32>");
  EXPECT_EQ(message([&] {
              f.sign(f.constant(Type{ElementType::kU8, {2}}, {1}));
            }),
            "[stablehlo] sign: needs a signed integer or float operand, got tensor<2xui8>");
  EXPECT_EQ(message([&] { f.erf(idx); }), "[stablehlo] erf: needs a float operand, got tensor<2x2xi32>");
  EXPECT_EQ(message([&] { f.logical_and(floats, floats); }),
            "[stablehlo] and: needs bool or integer operands, got tensor<2x2xf32>");
  EXPECT_EQ(message([&] { f.shift_right_logical(f.arg(3), f.arg(3)); }),
            "[stablehlo] shift_right_logical: needs integer operands, got tensor<2xi1>");
  EXPECT_EQ(message([&] {
              f.clamp(f.constant(Type{ElementType::kF32, {2}}, {0.0}), floats, floats);
            }),
            "[stablehlo] clamp: a bound must be a tensor<f32> or a tensor<2x2xf32>, got tensor<2xf32>");
  EXPECT_EQ(message([&] { f.bitcast_convert(floats, ElementType::kS64); }),
            "[stablehlo] bitcast_convert: tensor<2x2xf32> to i64 changes the element size; only same-size "
            "non-bool types are supported");
  EXPECT_EQ(message([&] { f.complex(floats, table); }),
            "[stablehlo] complex: needs two f32 or two f64 operands of one shape, got tensor<2x2xf32> and "
            "tensor<5x3xf32>");
  EXPECT_EQ(message([&] { f.real(floats); }), "[stablehlo] real: needs a complex operand, got tensor<2x2xf32>");
  EXPECT_EQ(message([&] { f.fft(floats, FftType::kForward, {2}); }),
            "[stablehlo] fft FFT: needs complex values, got tensor<2x2xf32>");
  EXPECT_EQ(message([&] { f.fft(table, FftType::kRealForward, {4}); }),
            "[stablehlo] fft RFFT: dim 1 of tensor<5x3xf32> is 3, the lengths [4] need 4");
  EXPECT_EQ(message([&] { f.fft(f.complex(floats, floats), FftType::kRealInverse, {4}); }),
            "[stablehlo] fft IRFFT: dim 1 of tensor<2x2xcomplex<f32>> is 2, the lengths [4] need 3");
  EXPECT_EQ(message([&] { f.fft(floats, FftType::kRealForward, {1, 1, 2, 2}); }),
            "[stablehlo] fft: 4 lengths for tensor<2x2xf32>; give 1 to 3, at most its rank");
  EXPECT_EQ(message([&] { f.constant(Type{ElementType::kC64, {}}, {1.0}); }),
            "[stablehlo] constant of tensor<complex<f32>>: complex constants are not printed; build them with "
            "complex(re, im)");
  EXPECT_EQ(message([&] {
              f.iota(Type{ElementType::kS32, {3}}, 1);
            }),
            "[stablehlo] iota: dimension 1 is out of range for tensor<3xi32>");
  EXPECT_EQ(message([&] {
              f.slice(table, {0, 2}, {5, 4});
            }),
            "[stablehlo] slice: dim 1 of tensor<5x3xf32> cannot take [2:4:1]");
  EXPECT_EQ(message([&] {
              f.concatenate({table, floats}, 0);
            }),
            "[stablehlo] concatenate: tensor<2x2xf32> does not join tensor<5x3xf32> along dim 0");
  EXPECT_EQ(message([&] {
              f.pad(floats, f.constant(Type{ElementType::kS32, {}}, {0}), {0, 0}, {0, 0}, {0, 0});
            }),
            "[stablehlo] pad: the padding value must be a tensor<f32>, got tensor<i32>");
  EXPECT_EQ(message([&] {
              f.pad(floats, f.constant(Type{ElementType::kF32, {}}, {0}), {-3, 0}, {0, 0}, {0, 0});
            }),
            "[stablehlo] pad: dim 0 of tensor<2x2xf32> cannot take low -3, high 0, interior 0");
  EXPECT_EQ(message([&] {
              f.dynamic_slice(table, {floats, floats}, {1, 1});
            }),
            "[stablehlo] dynamic_slice: start indices must be integers, got tensor<2x2xf32>");
  EXPECT_EQ(
      message([&] {
        f.rng_bit_generator(idx, Type{ElementType::kU32, {4}});
      }),
      "[stablehlo] rng_bit_generator: the state of THREE_FRY must be a tensor<2xui64>, got tensor<2x2xi32>");
  EXPECT_EQ(message([&] { f.donate(4); }), "[stablehlo] donate: main has 4 arguments, asked for 4");
  f.donate(1, 0);
  f.returns({table});
  EXPECT_EQ(
      message([&] { f.text(); }),
      "[stablehlo] donate: argument 1 of main is tensor<2x2xf32>, output 0 is tensor<5x3xf32>; an aliased "
      "output must have its type");
}

TEST(StablehloOpsTest, GatherAndScatterRejectBadOperands) {
  Function f("main", {Type{ElementType::kF32, {5, 3}}, Type{ElementType::kF32, {2, 2}},
                      Type{ElementType::kS32, {2, 2}}});
  const Value table = f.arg(0), floats = f.arg(1), idx = f.arg(2);
  auto message = [](auto fn) { return error_message<ConfigError>(fn); };
  EXPECT_EQ(message([&] { f.take_rows(table, floats); }),
            "[stablehlo] take_rows: indices must be integers, got tensor<2x2xf32>");
  EXPECT_EQ(message([&] { f.take_rows(table, idx, 2); }),
            "[stablehlo] take_rows: dimension 2 is out of range for rank 2");
  GatherDims wrong;
  wrong.offset_dims = {1};
  wrong.start_index_map = {0};
  wrong.index_vector_dim = 2;
  EXPECT_EQ(message([&] {
              f.gather(table, idx, wrong, {1, 3});
            }),
            "[stablehlo] gather: offset_dims [1] for 2 kept slice dims");
  wrong.collapsed_slice_dims = {0};
  EXPECT_EQ(message([&] {
              f.gather(table, idx, wrong, {2, 3});
            }),
            "[stablehlo] gather: dim 0 is collapsed or a batching dim, so its slice size must be 1, got 2");
  EXPECT_EQ(
      message([&] { f.scatter_add_rows(table, idx, floats); }),
      "[stablehlo] scatter_add_rows: updates for tensor<5x3xf32> at indices tensor<2x2xi32> along dim 0 "
      "must be tensor<2x2x3xf32>, got tensor<2x2xf32>");
  xla::stablehlo::ScatterDims scatter;
  scatter.update_window_dims = {2};
  scatter.inserted_window_dims = {0};
  scatter.scatter_dims_to_operand_dims = {0};
  scatter.index_vector_dim = 2;
  EXPECT_EQ(message([&] {
              f.scatter(table, idx, f.constant(Type{ElementType::kF32, {2, 2, 4}}, {0}), scatter);
            }),
            "[stablehlo] scatter: update dim 2 (4) is larger than the operand's 3");
}

// Note [Erf accuracy]: chlo.erf is lowered by XLA itself (a rational
// approximation in f32); this measures it against the double-precision
// std::erf on 2^16 + 1 points of [-8, 8] and near 0, where erf(x) ~ 2x/sqrt(pi).
TEST(StablehloOpsTest, ErfMatchesStdErfOverAWideRange) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  HostTensor x{ElementType::kF32, {}, {}};
  const int n = 1 << 16;
  for (int i = 0; i <= n; ++i) x.values.push_back(static_cast<float>(-8.0 + 16.0 * i / n));
  for (double tiny : {1e-30, 1e-10, 1e-5, -1e-5, 3e-3, -0.1}) x.values.push_back(static_cast<float>(tiny));
  x.dims = {static_cast<int64_t>(x.values.size())};
  Function f("main", {Type{ElementType::kF32, x.dims}});
  f.returns({f.erf(f.arg(0))});
  Module m("erf");
  m.add(f);
  const at::Tensor got = PluginRun().run_host(m.text(), {x})[0].to(at::kDouble);
  double max_abs = 0, max_rel = 0;
  for (size_t i = 0; i < x.values.size(); ++i) {
    const double want = std::erf(x.values[i]), have = got[static_cast<int64_t>(i)].item<double>();
    max_abs = std::max(max_abs, std::abs(have - want));
    if (want != 0) max_rel = std::max(max_rel, std::abs(have - want) / std::abs(want));
  }
  RecordProperty("erf_max_abs_error", std::to_string(max_abs));
  RecordProperty("erf_max_rel_error", std::to_string(max_rel));
  std::cout << "chlo.erf on the CPU plugin vs std::erf: max abs error " << max_abs << ", max rel error "
            << max_rel << "\n";
  // A few f32 ulps (2^-23 ~ 1.2e-7 relative).
  EXPECT_LT(max_abs, 4e-7);
  EXPECT_LT(max_rel, 1e-6);
}

TEST(StablehloOpsTest, RandomBitsAreReproducibleFromTheKey) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  const Type state{ElementType::kU64, {2}};
  Function f("main", {state, Type{ElementType::kF32, {64, 64}}});
  const std::vector<Value> bits = f.rng_bit_generator(f.arg(0), Type{ElementType::kU32, {8}});
  const std::vector<Value> u = f.uniform(f.arg(0), {64, 64});
  // Dropout with p = 0.25: keep where u >= p, scale the kept by 1 / (1 - p).
  const Value keep = f.compare(u[1], f.constant(Type{ElementType::kF32, {64, 64}}, {0.25}), Direction::kGE);
  const Value scaled = f.multiply(f.arg(1), f.constant(Type{ElementType::kF32, {64, 64}}, {1.0 / 0.75}));
  const Value dropped = f.select(keep, scaled, f.constant(Type{ElementType::kF32, {64, 64}}, {0.0}));
  f.returns({bits[0], bits[1], u[1], dropped});
  Module m("rng");
  m.add(f);
  const std::string golden_path = xla_test_file("golden/ops_rng.mlir");
  if (std::getenv("STRATA_UPDATE_GOLDEN") != nullptr) std::ofstream(golden_path) << m.text();
  EXPECT_EQ(m.text(), read_file(golden_path));

  const PluginRun plugin;
  const HostTensor ones{ElementType::kF32, {64, 64}, std::vector<double>(64 * 64, 1.0)};
  const Tensors a = plugin.run_host(m.text(), {{ElementType::kU64, {2}, {42, 7}}, ones});
  const Tensors again = plugin.run_host(m.text(), {{ElementType::kU64, {2}, {42, 7}}, ones});
  const Tensors other = plugin.run_host(m.text(), {{ElementType::kU64, {2}, {43, 7}}, ones});
  const Tensors next = plugin.run_host(m.text(), {{ElementType::kU64, {2}, {42, 8}}, ones});
  for (size_t o = 0; o < a.size(); ++o) EXPECT_TRUE(at::equal(a[o], again[o])) << "output " << o;
  EXPECT_FALSE(at::equal(a[1], other[1])) << "another key gives other bits";
  EXPECT_FALSE(at::equal(a[1], next[1])) << "another counter gives other bits";
  EXPECT_FALSE(at::equal(a[0].to(at::kLong), at::tensor(std::vector<int64_t>{42, 7})))
      << "the state advances";

  const at::Tensor uniform = a[2];
  EXPECT_GE(uniform.min().item<float>(), 0.0f);
  EXPECT_LT(uniform.max().item<float>(), 1.0f);
  EXPECT_NEAR(uniform.mean().item<double>(), 0.5, 0.02);  // 4096 draws: sd of the mean ~ 0.0045
  EXPECT_NEAR(uniform.var().item<double>(), 1.0 / 12, 0.01);
  const at::Tensor kept = a[3].ne(0);
  EXPECT_NEAR(kept.to(at::kDouble).mean().item<double>(), 0.75, 0.03);
  EXPECT_TRUE(at::allclose(a[3].masked_select(kept), at::full({1}, 1.0 / 0.75, at::kFloat)));
  EXPECT_TRUE(at::equal(kept, uniform.ge(0.25)));

  // XLA's THREE_FRY is one algorithm: jaxlib's XLA draws the same bits.
  std::string skip;
  const auto jax = run_on_jax({{m.text(), {{ElementType::kU64, {2}, {42, 7}}, ones}}}, skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_EQ(jax.size(), 1u);
  for (size_t o = 0; o < a.size(); ++o)
    EXPECT_TRUE(at::equal(tensor_from_json(jax[0][o]).to(at::kDouble), a[o].to(at::kDouble)))
        << "output " << o;
}

TEST(StablehloOpsTest, DonatedArgumentsAreConsumedByTheExecution) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  const Type v{ElementType::kF32, {4}};
  // An optimizer-style update: param -= lr * grad, the parameter's buffer
  // reused for the result; the gradient is a donor XLA may reuse at will.
  Function f("main", {v, v, Type{ElementType::kF32, {}}});
  const Value lr = f.broadcast_in_dim(f.arg(2), {4}, {});
  const Value updated = f.subtract(f.arg(0), f.multiply(lr, f.arg(1)));
  f.donate(0, 0);
  f.donate(1);
  const std::vector<Value> out = f.optimization_barrier({updated, f.arg(1)});
  f.returns({out[0], f.negate(out[1])});
  Module m("donation");
  m.add(f);
  const std::string golden_path = xla_test_file("golden/ops_donation.mlir");
  if (std::getenv("STRATA_UPDATE_GOLDEN") != nullptr) std::ofstream(golden_path) << m.text();
  EXPECT_EQ(m.text(), read_file(golden_path));
  EXPECT_NE(m.text().find("%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32}"), std::string::npos);
  EXPECT_NE(m.text().find("%arg1: tensor<4xf32> {jax.buffer_donor = true}"), std::string::npos);

  const PluginRun plugin;
  const HostTensor p{ElementType::kF32, {4}, {1, 2, 3, 4}}, g{ElementType::kF32, {4}, {0.5, -1, 2, 0}};
  const xla::Buffer param = plugin.upload(p), grad = plugin.upload(g),
                    rate = plugin.upload({ElementType::kF32, {}, {0.5}});
  const xla::LoadedExecutable exe = plugin.client.compile(m.text(), xla::CompileOptions());
  const std::vector<xla::Buffer> result = std::move(exe.execute({{&param, &grad, &rate}})[0]);
  expect_same(to_tensor(result[0]), to_tensor(p) - 0.5 * to_tensor(g), "updated parameter");
  expect_same(to_tensor(result[1]), -to_tensor(g), "negated gradient");
  // The donated parameter is gone; the learning rate was not donated.
  EXPECT_THROW(to_tensor(param), xla::XlaError);
  expect_same(to_tensor(rate), at::full({}, 0.5, at::kFloat), "the undonated argument");
}

}  // namespace
}  // namespace strata::testing
