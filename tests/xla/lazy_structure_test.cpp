// Programs known by their structure (Note [Programs known by their
// structure] in strata/xla/lazy_graph.h): a step of the same graph finds
// its compiled program without emitting text; a difference only an
// attribute shows (a direction, a reversed dim, a shared input) gives
// another program with the right values; an op without identity is found
// by its text; and the check mode catches an emitter whose attributes
// were left out of its identity.
#include <gtest/gtest.h>

#include <cstdlib>

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

template <class T>
std::vector<T> read(const xla::Buffer& b) {
  std::vector<T> out(b.byte_size() / sizeof(T));
  b.to_host(out.data(), b.byte_size());
  return out;
}

class LazyStructureTest : public ::testing::Test {
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

TEST_F(LazyStructureTest, ASteadyLoopEmitsItsProgramOnceAndFindsItByStructureAfter) {
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

TEST_F(LazyStructureTest, WhatOnlyAnAttributeShowsGivesAnotherProgramWithItsOwnValues) {
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

TEST_F(LazyStructureTest, AnOpWithoutIdentityIsFoundByItsText) {
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

TEST_F(LazyStructureTest, TheCheckCatchesAnEmitterWhoseAttributesWereLeftOut) {
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

TEST_F(LazyStructureTest, TheCacheForgetsAStructureWithItsProgram) {
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

}  // namespace
}  // namespace strata::testing
