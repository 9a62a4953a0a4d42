// The lazy graph on XLA's CPU plugin: a step's program is emitted from the
// nodes its outputs reach (each shared node once), compiled once through
// the LRU cache keyed by its text, found again by its graph's structure,
// fed host scalars as parameters so a changing value compiles nothing
// new, and explained when it does compile.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "strata/xla/lazy_graph.h"
#include "support/errors.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

using xla::ElementType;
using xla::lazy::Attributes;
using xla::lazy::Node;
using xla::lazy::NodePtr;
namespace hlo = xla::stablehlo;

hlo::Type f32(std::vector<int64_t> dims) { return hlo::Type{ElementType::kF32, std::move(dims)}; }

NodePtr add(const NodePtr& a, const NodePtr& b) {
  return Node::op("add", {a, b}, a->type(),
                  [](hlo::Function& f, const std::vector<hlo::Value>& in) { return f.add(in[0], in[1]); });
}
NodePtr mul(const NodePtr& a, const NodePtr& b) {
  return Node::op("mul", {a, b}, a->type(),
                  [](hlo::Function& f, const std::vector<hlo::Value>& in) { return f.multiply(in[0], in[1]); });
}
// x * s with a scalar s broadcast to x's shape.
NodePtr scale(const NodePtr& x, const NodePtr& s) {
  return Node::op("scale", {x, s}, x->type(), [](hlo::Function& f, const std::vector<hlo::Value>& in) {
    return f.multiply(in[0], f.broadcast_in_dim(in[1], in[0].type.dims, {}));
  });
}

// A captured enum: the emitter's bytes are its identity.
NodePtr compare(const NodePtr& a, const NodePtr& b, hlo::Direction direction) {
  return Node::op("compare", {a, b}, {ElementType::kPred, a->type().dims},
                  [direction](hlo::Function& f, const std::vector<hlo::Value>& in) {
                    return f.compare(in[0], in[1], direction);
                  });
}
// A captured vector, named through Attributes.
NodePtr reverse(const NodePtr& x, const std::vector<int64_t>& dims) {
  return Node::op("reverse", {x}, x->type(), Attributes{}.add(dims),
                  [dims](hlo::Function& f, const std::vector<hlo::Value>& in) { return f.reverse(in[0], dims); });
}
// The same, with the dims left out of its attributes: a defect the check
// mode has to catch.
NodePtr reverse_unnamed(const NodePtr& x, const std::vector<int64_t>& dims) {
  return Node::op("reverse", {x}, x->type(), Attributes{},
                  [dims](hlo::Function& f, const std::vector<hlo::Value>& in) { return f.reverse(in[0], dims); });
}

template <class T = float>
std::vector<T> read(const xla::Buffer& b) {
  std::vector<T> out(b.byte_size() / sizeof(T));
  b.to_host(out.data(), b.byte_size());
  return out;
}

class LazyGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
    client_ = std::make_shared<xla::Client>(xla::Client::create(xla::Plugin::load(cpu_plugin_path())));
    device_ = client_->addressable_devices().at(0);
  }
  NodePtr upload(const std::vector<float>& values, std::vector<int64_t> dims) {
    auto buffer = std::make_shared<xla::Buffer>(client_->buffer_from_host(
        values.data(), values.size() * sizeof(float), ElementType::kF32, dims, device_));
    return Node::buffer(buffer, f32(std::move(dims)));
  }
  std::shared_ptr<xla::Client> client_;
  xla::Device device_;
};

TEST_F(LazyGraphTest, ASharedNodeIsEmittedOnceAndParametersComeInFirstUseOrder) {
  NodePtr a = Node::host_scalar(2.0, ElementType::kF32);
  NodePtr b = Node::host_scalar(3.0, ElementType::kF32);
  NodePtr s = add(a, b);
  NodePtr out = mul(s, s);  // s used twice: one add in the program
  xla::lazy::Program p = xla::lazy::build_program({out, s});
  EXPECT_EQ(p.ops, 2u);
  ASSERT_EQ(p.parameters.size(), 2u);
  EXPECT_EQ(p.parameters[0].get(), a.get());
  EXPECT_EQ(p.parameters[1].get(), b.get());
  size_t adds = 0;
  for (size_t at = p.text.find("stablehlo.add"); at != std::string::npos; at = p.text.find("stablehlo.add", at + 1))
    ++adds;
  EXPECT_EQ(adds, 1u) << p.text;
  // The same nodes print the same text.
  EXPECT_EQ(xla::lazy::build_program({out, s}).text, p.text);
}

TEST_F(LazyGraphTest, AStepRunsAndAChangingScalarCompilesNothingNew) {
  xla::lazy::Executor executor(client_, device_);
  NodePtr w = upload({1, 2, 3, 4}, {2, 2});
  for (int step = 0; step < 5; ++step) {
    // w * lr + w, with lr changing every step: a parameter, not a constant.
    const double lr = 0.5 + step;
    NodePtr out = add(scale(w, Node::host_scalar(lr, ElementType::kF32)), w);
    std::vector<xla::Buffer> result = executor.run({out});
    ASSERT_EQ(result.size(), 1u);
    const std::vector<float> got = read(result[0]);
    const std::vector<float> base{1, 2, 3, 4};
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], base[i] * static_cast<float>(lr) + base[i]);
  }
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 1);
  EXPECT_EQ(m.cache_hits, 4);
  EXPECT_EQ(m.executions, 5);
  EXPECT_EQ(m.host_scalars_fed, 5);
  ASSERT_EQ(m.compile_reasons.size(), 1u);
  EXPECT_EQ(m.compile_reasons[0], "the first program");
}

TEST_F(LazyGraphTest, ANewShapeCompilesAgainAndSaysWhy) {
  xla::lazy::Executor executor(client_, device_);
  executor.run({add(upload({1, 2}, {2}), upload({3, 4}, {2}))});
  executor.run({add(upload({1, 2, 3}, {3}), upload({3, 4, 5}, {3}))});
  executor.run({mul(upload({1, 2, 3}, {3}), upload({3, 4, 5}, {3}))});
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 3);
  ASSERT_EQ(m.compile_reasons.size(), 3u);
  EXPECT_EQ(m.compile_reasons[1].rfind("the shapes, first at: ", 0), 0u) << m.compile_reasons[1];
  EXPECT_EQ(m.compile_reasons[2].rfind("the ops, first at: ", 0), 0u) << m.compile_reasons[2];
  EXPECT_NE(m.compile_reasons[2].find("stablehlo.multiply"), std::string::npos) << m.compile_reasons[2];
}

TEST_F(LazyGraphTest, TheCacheKeepsAtMostItsCapacityLeastRecentlyUsedFirstOut) {
  xla::lazy::Executor executor(client_, device_, /*capacity=*/2);
  auto program = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    return add(upload(v, {n}), upload(v, {n}));
  };
  executor.run({program(1)});
  executor.run({program(2)});
  executor.run({program(1)});  // a hit: 1 is now the most recent
  executor.run({program(3)});  // evicts 2
  EXPECT_EQ(executor.cached(), 2u);
  executor.run({program(1)});  // still cached
  executor.run({program(2)});  // compiled again
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 4);
  EXPECT_EQ(m.cache_hits, 2);
}

TEST_F(LazyGraphTest, ScalarsOfEveryFloatTypeArriveExactly) {
  xla::lazy::Executor executor(client_, device_);
  // 1/3 rounded into bf16 and f16, then widened to f32 on the device.
  for (ElementType type : {ElementType::kBF16, ElementType::kF16, ElementType::kF32}) {
    NodePtr s = Node::host_scalar(1.0 / 3.0, type);
    NodePtr wide = Node::op("convert", {s}, f32({}), [](hlo::Function& f, const std::vector<hlo::Value>& in) {
      return f.convert(in[0], ElementType::kF32);
    });
    const float got = read(executor.run({wide})[0]).at(0);
    const float want = type == ElementType::kBF16 ? 0.333984375f : type == ElementType::kF16 ? 0.333251953125f
                                                                                              : 1.0f / 3.0f;
    EXPECT_EQ(got, want) << xla::stablehlo_name(type);
  }
}

TEST_F(LazyGraphTest, NodesRecordedFromTwoThreadsRunAsOneStep) {
  // Recording needs no lock: nodes are immutable and shared.
  NodePtr w = upload({1, 1, 1, 1}, {4});
  NodePtr left, right;
  std::thread t([&] {
    NodePtr x = w;
    for (int i = 0; i < 200; ++i) x = add(x, w);
    left = x;
  });
  NodePtr y = w;
  for (int i = 0; i < 300; ++i) y = add(y, w);
  right = y;
  t.join();
  xla::lazy::Executor executor(client_, device_);
  std::vector<xla::Buffer> out = executor.run({left, right});
  EXPECT_EQ(read(out[0]), std::vector<float>(4, 201.0f));
  EXPECT_EQ(read(out[1]), std::vector<float>(4, 301.0f));
}

TEST_F(LazyGraphTest, BadGraphsAreRefusedNamingWhat) {
  EXPECT_EQ(error_message([] { xla::lazy::build_program({}); }), "[xla] a step program needs at least one output");
  EXPECT_EQ(error_message([] { Node::op("add", {nullptr}, f32({}), [](hlo::Function& f, const auto& in) {
              return in[0];
            }); }),
            "[xla] op 'add': input 0 is null");
  NodePtr s = Node::host_scalar(1.0, ElementType::kF32);
  NodePtr liar = Node::op("liar", {s}, f32({2}), [](hlo::Function&, const std::vector<hlo::Value>& in) { return in[0]; });
  EXPECT_EQ(error_message([&] { xla::lazy::build_program({liar}); }),
            "[xla] op 'liar' emitted tensor<f32> where its node says tensor<2xf32>");
  EXPECT_NE(xla::lazy::explain_difference("a\nb dense<1.0>\n", "a\nb dense<2.0>\n").find("a constant baked"),
            std::string::npos);
}

// Note [Programs known by their structure]: a step of the same graph
// finds its compiled program without emitting text; a difference only an
// attribute shows gives another program with the right values; an op
// without identity is found by its text; the check mode catches an
// emitter whose attributes were left out of its identity.
TEST_F(LazyGraphTest, ASteadyLoopEmitsItsProgramOnceAndFindsItByStructureAfter) {
  xla::lazy::Executor executor(client_, device_);
  for (int step = 0; step < 4; ++step) {
    NodePtr x = upload({1.0f + static_cast<float>(step), 2, 3, 4}, {2, 2});
    const std::vector<float> got = read<float>(executor.run({add(reverse(x, {0}), x)})[0]);
    const float a = 1.0f + static_cast<float>(step);
    EXPECT_EQ(got, (std::vector<float>{a + 3, 6, 3 + a, 6})) << "step " << step;
  }
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 1);
  EXPECT_EQ(m.programs_emitted, 1);
  EXPECT_EQ(m.structure_hits, 3);
  EXPECT_EQ(m.cache_hits, 3);
}

TEST_F(LazyGraphTest, WhatOnlyAnAttributeShowsGivesAnotherProgramWithItsOwnValues) {
  xla::lazy::Executor executor(client_, device_);
  const std::vector<float> v{1, 2, 3, 4};
  // The same op names and types; the reversed dim differs.
  EXPECT_EQ(read<float>(executor.run({reverse(upload(v, {2, 2}), {0})})[0]), (std::vector<float>{3, 4, 1, 2}));
  EXPECT_EQ(read<float>(executor.run({reverse(upload(v, {2, 2}), {1})})[0]), (std::vector<float>{2, 1, 4, 3}));
  // The same again; the direction differs.
  const auto lt = read<uint8_t>(executor.run({compare(upload(v, {4}), upload({2, 2, 2, 2}, {4}), hlo::Direction::kLT)})[0]);
  const auto gt = read<uint8_t>(executor.run({compare(upload(v, {4}), upload({2, 2, 2, 2}, {4}), hlo::Direction::kGT)})[0]);
  EXPECT_EQ(lt, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(gt, (std::vector<uint8_t>{0, 0, 1, 1}));
  // x + x (one parameter) and x + y (two) of the same types.
  NodePtr x = upload(v, {4});
  EXPECT_EQ(read<float>(executor.run({add(x, x)})[0]), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(read<float>(executor.run({add(upload(v, {4}), upload({10, 10, 10, 10}, {4}))})[0]),
            (std::vector<float>{11, 12, 13, 14}));
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 6);
  EXPECT_EQ(m.structure_hits, 0);
}

TEST_F(LazyGraphTest, AnOpWithoutIdentityIsFoundByItsText) {
  xla::lazy::Executor executor(client_, device_);
  const xla::lazy::EmitFn negate = [](hlo::Function& f, const std::vector<hlo::Value>& in) { return f.negate(in[0]); };
  for (int step = 0; step < 3; ++step) {
    NodePtr y = Node::op("negate", {upload({1, 2}, {2})}, f32({2}), negate);
    EXPECT_EQ(read<float>(executor.run({y})[0]), (std::vector<float>{-1, -2}));
  }
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 1);
  EXPECT_EQ(m.cache_hits, 2);
  EXPECT_EQ(m.structure_hits, 0);
  EXPECT_EQ(m.programs_emitted, 3);
}

TEST_F(LazyGraphTest, TheCheckCatchesAnEmitterWhoseAttributesWereLeftOut) {
  // The test suite runs with STRATA_XLA_CHECK_KEYS=1 (tests/support/test_main.cpp).
  const char* check = std::getenv("STRATA_XLA_CHECK_KEYS");
  if (check == nullptr || std::string(check) != "1") GTEST_SKIP() << "STRATA_XLA_CHECK_KEYS is not 1";
  xla::lazy::Executor executor(client_, device_);
  const std::vector<float> v{1, 2, 3, 4};
  executor.run({reverse_unnamed(upload(v, {2, 2}), {0})});
  const std::string message = error_message([&] { executor.run({reverse_unnamed(upload(v, {2, 2}), {1})}); });
  EXPECT_NE(message.find("[xla] a step of the same structure as a compiled program emitted another text (the ops, "
                         "first at: "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("leaves out an attribute"), std::string::npos) << message;
}

TEST_F(LazyGraphTest, TheCacheForgetsAStructureWithItsProgram) {
  xla::lazy::Executor executor(client_, device_, /*capacity=*/1);
  auto program = [&](int64_t n) {
    std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    return add(upload(ones, {n}), upload(ones, {n}));
  };
  executor.run({program(1)});
  executor.run({program(2)});  // evicts 1, and its structure with it
  EXPECT_EQ(read<float>(executor.run({program(1)})[0]), (std::vector<float>{2}));
  const xla::lazy::GraphMetrics m = executor.metrics();
  EXPECT_EQ(m.compiles, 3);
  EXPECT_EQ(m.structure_hits, 0);
  EXPECT_EQ(executor.cached(), 1u);
}

// Note [Collectives in the step]: one program replicated over 2 and 4 of
// the CPU plugin's devices, each replica with its own buffer, the
// collectives inside the program.
class LazyGraphReplicatedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
    client_ = std::make_shared<xla::Client>(xla::Client::create(
        xla::Plugin::load(cpu_plugin_path()), xla::ClientOptions().with_create_option("cpu_device_count", int64_t{4})));
    devices_ = client_->addressable_devices();
    ASSERT_EQ(devices_.size(), 4u);
  }
  NodePtr upload(const std::vector<float>& values, const xla::Device& device) {
    const std::vector<int64_t> dims{static_cast<int64_t>(values.size())};
    auto buffer = std::make_shared<xla::Buffer>(
        client_->buffer_from_host(values.data(), values.size() * sizeof(float), ElementType::kF32, dims, device));
    return Node::buffer(buffer, f32(dims));
  }
  std::shared_ptr<xla::Client> client_;
  std::vector<xla::Device> devices_;
};

TEST_F(LazyGraphReplicatedTest, CollectivesRunInsideOneProgramOnTwoAndFourDevices) {
  for (size_t n : {2u, 4u}) {
    SCOPED_TRACE(std::to_string(n) + " replicas");
    xla::lazy::Executor executor(client_, std::vector<xla::Device>(devices_.begin(), devices_.begin() + n));
    hlo::ReplicaGroups all(1);
    for (size_t r = 0; r < n; ++r) all[0].push_back(static_cast<int64_t>(r));
    for (int run = 0; run < 2; ++run) {
      std::vector<std::vector<NodePtr>> outputs(n);
      for (size_t r = 0; r < n; ++r) {
        // Replica r holds (r + 1) * [1, 2, 3, 4], scaled by a host scalar
        // of its own value (a step-varying scalar per replica).
        const float k = static_cast<float>(r + 1);
        NodePtr x = scale(upload({k, 2 * k, 3 * k, 4 * k}, devices_[r]), Node::host_scalar(run + 1.0, ElementType::kF32));
        outputs[r] = {xla::lazy::all_reduce(x, hlo::ReduceOp::kSum, all), xla::lazy::all_reduce(x, hlo::ReduceOp::kMax, all),
                      xla::lazy::all_gather(x, 0, all), xla::lazy::reduce_scatter(x, 0, hlo::ReduceOp::kSum, all)};
      }
      const auto results = executor.run_replicated(outputs);
      ASSERT_EQ(results.size(), n);
      const float scale_by = static_cast<float>(run + 1), total = static_cast<float>(n * (n + 1) / 2);
      std::vector<float> sum, max, gathered;
      for (int j = 1; j <= 4; ++j) sum.push_back(scale_by * total * j), max.push_back(scale_by * n * j);
      for (size_t r = 0; r < n; ++r)
        for (int j = 1; j <= 4; ++j) gathered.push_back(scale_by * (r + 1) * j);
      for (size_t r = 0; r < n; ++r) {
        EXPECT_EQ(read(results[r][0]), sum) << "replica " << r;
        EXPECT_EQ(read(results[r][1]), max) << "replica " << r;
        EXPECT_EQ(read(results[r][2]), gathered) << "replica " << r;
        const size_t part = 4 / n;
        EXPECT_EQ(read(results[r][3]), std::vector<float>(sum.begin() + r * part, sum.begin() + (r + 1) * part))
            << "replica " << r;
      }
    }
    EXPECT_EQ(executor.metrics().compiles, 1) << "the second run finds the program compiled";
    EXPECT_EQ(executor.metrics().structure_hits, 1) << "by the structure every replica recorded";
    EXPECT_EQ(executor.metrics().executions, 2);
  }
}

TEST_F(LazyGraphReplicatedTest, ReplicatedStepsAreRefusedNamingWhatIsWrong) {
  xla::lazy::Executor two(client_, std::vector<xla::Device>{devices_[0], devices_[1]});
  NodePtr a = upload({1, 2}, devices_[0]), b = upload({1, 2}, devices_[1]);
  EXPECT_EQ(error_message([&] { two.run({a}); }),
            "[xla] run() on an executor of 2 devices; give each replica its outputs with run_replicated()");
  EXPECT_EQ(error_message([&] { two.run_replicated({{a}}); }), "[xla] 1 replicas' outputs for an executor of 2 devices");
  const std::string differs = error_message([&] { two.run_replicated({{add(a, a)}, {mul(b, b)}}); });
  EXPECT_EQ(differs.rfind("[xla] replica 1 recorded another step than replica 0 (the ops, first at: ", 0), 0u) << differs;
  EXPECT_NE(differs.find("every device must record the same ops on the same shapes"), std::string::npos);
  EXPECT_EQ(error_message([&] { xla::lazy::Executor(client_, std::vector<xla::Device>{devices_[1], devices_[1]}); }),
            "[xla] device " + std::to_string(devices_[1].id) +
                " is given for replicas 0 and 1; each replica needs a device of its own");
  EXPECT_EQ(error_message([&] { xla::lazy::reduce_scatter(upload({1, 2, 3}, devices_[0]), 0, hlo::ReduceOp::kSum, {{0, 1}}); }),
            "[xla] reduce_scatter of tensor<3xf32> along dim 0: 3 does not split into 2 equal parts; pad it to a "
            "multiple of the group size");
  EXPECT_EQ(error_message([&] { xla::lazy::all_gather(a, 1, {{0, 1}}); }), "[xla] all_gather along dim 1 of tensor<2xf32>");
  EXPECT_EQ(error_message([&] { xla::lazy::all_reduce(a, hlo::ReduceOp::kSum, {{0, 1}, {2}}); }),
            "[xla] all_reduce: replica groups of 2 and 1 replicas; every group must be the same size");
}

}  // namespace
}  // namespace strata::testing
