// The StableHLO builder: its text, checked against golden files
// (tests/xla/golden/<name>.mlir, written by STRATA_UPDATE_GOLDEN=1 and read
// by eye before committing), its determinism, and its shape checks. That
// the text means what it should is oracle_test.cpp's job.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "strata/xla/stablehlo.h"
#include "support/errors.h"
#include "xla/catalogue.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

using xla::stablehlo::element_literal;
using xla::stablehlo::replica_groups_attribute;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(StablehloTest, CatalogueMatchesGoldenFiles) {
  const bool update = std::getenv("STRATA_UPDATE_GOLDEN") != nullptr;
  for (const CatalogueEntry& entry : catalogue()) {
    SCOPED_TRACE(entry.name);
    const std::string path = xla_test_file("golden/" + entry.name + ".mlir");
    if (update) std::ofstream(path) << entry.module;
    const std::string golden = read_file(path);
    ASSERT_FALSE(golden.empty()) << path << " is missing; run with STRATA_UPDATE_GOLDEN=1 to write it";
    EXPECT_EQ(entry.module, golden);
  }
}

TEST(StablehloTest, SameCallsPrintTheSameText) {
  const auto first = catalogue();
  const auto second = catalogue();
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].module, second[i].module) << first[i].name;
}

TEST(StablehloTest, SmallestModuleReadsAsExpected) {
  Function f("main", {Type{ElementType::kF32, {2}}, Type{ElementType::kF32, {2}}});
  f.returns({f.add(f.arg(0), f.arg(1))});
  Module m("tiny");
  m.add(f);
  EXPECT_EQ(m.text(),
            "module @tiny attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
            "  func.func public @main(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>) {\n"
            "    %0 = \"stablehlo.add\"(%arg0, %arg1) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>\n"
            "    return %0 : tensor<2xf32>\n"
            "  }\n"
            "}\n");
}

TEST(StablehloTest, LiteralsAreValidMlirNumbers) {
  EXPECT_EQ(element_literal(1.0, ElementType::kF32), "1.0");
  EXPECT_EQ(element_literal(-0.25, ElementType::kF32), "-0.25");
  EXPECT_EQ(element_literal(1e20, ElementType::kF32), "1.0e+20");
  EXPECT_EQ(element_literal(0.1, ElementType::kF64), "0.10000000000000001");
  EXPECT_EQ(element_literal(std::numeric_limits<double>::infinity(), ElementType::kF32), "0x7F800000");
  EXPECT_EQ(element_literal(-std::numeric_limits<double>::infinity(), ElementType::kBF16), "0xFF80");
  EXPECT_EQ(element_literal(std::numeric_limits<double>::infinity(), ElementType::kF16), "0x7C00");
  EXPECT_EQ(element_literal(std::numeric_limits<double>::infinity(), ElementType::kF64),
            "0x7FF0000000000000");
  EXPECT_EQ(element_literal(-3, ElementType::kS64), "-3");
  EXPECT_EQ(element_literal(2, ElementType::kPred), "true");
  EXPECT_EQ(error_message<ConfigError>([] { element_literal(0.5, ElementType::kS32); }),
            "[stablehlo] constant 0.5 is not an integer, but the element type is i32");
}

TEST(StablehloTest, ReplicaGroupsAreADenseI64Matrix) {
  EXPECT_EQ(replica_groups_attribute({{0, 1}}), "dense<[[0, 1]]> : tensor<1x2xi64>");
  EXPECT_EQ(replica_groups_attribute({{0, 2}, {1, 3}}), "dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>");
  EXPECT_EQ(error_message<ConfigError>([] {
              replica_groups_attribute({{0, 1}, {2}});
            }),
            "[stablehlo] replica group 1 has 1 replicas, group 0 has 2; groups must be the same size");
}

TEST(StablehloTest, OpsRejectMismatchedShapes) {
  Function f("main", {Type{ElementType::kF32, {2, 3}}, Type{ElementType::kF32, {3, 2}}});
  EXPECT_EQ(error_message<ConfigError>([&] { f.add(f.arg(0), f.arg(1)); }),
            "[stablehlo] add: operand types differ: tensor<2x3xf32> and tensor<3x2xf32>");
  EXPECT_EQ(error_message<ConfigError>([&] {
              f.dot_general(f.arg(0), f.arg(1), {{}, {}, {1}, {1}});
            }),
            "[stablehlo] dot_general: contracting dim sizes differ: 3 and 2");
  EXPECT_EQ(error_message<ConfigError>([&] { f.reshape(f.arg(0), {4}); }),
            "[stablehlo] reshape: tensor<2x3xf32> has 6 elements, [4] has 4");
  EXPECT_EQ(error_message<ConfigError>([&] {
              f.transpose(f.arg(0), {0, 0});
            }),
            "[stablehlo] transpose: dimension 0 is listed twice");
  EXPECT_EQ(error_message<ConfigError>([&] {
              f.broadcast_in_dim(f.arg(0), {2, 4}, {0, 1});
            }),
            "[stablehlo] broadcast_in_dim: operand dim 1 (3) cannot broadcast to 4");
  EXPECT_EQ(error_message<ConfigError>([&] {
              f.reduce_scatter(f.arg(0), 1, ReduceOp::kSum, {{0, 1}});
            }),
            "[stablehlo] reduce_scatter: dim 1 of tensor<2x3xf32> does not split into 2 equal parts");
  f.returns({f.arg(0)});
  EXPECT_EQ(error_message<ConfigError>([&] { f.negate(f.arg(0)); }),
            "[stablehlo] negate after returns() in main");
}

}  // namespace
}  // namespace strata::testing
