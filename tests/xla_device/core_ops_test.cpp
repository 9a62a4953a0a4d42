// The core ATen op list and docs/xla.md's coverage table stay true: the
// committed list is the installed torch's, and the table is what the live
// dispatcher says of each op once the xla device's kernels are registered
// (tests/xla_device/core_ops.h). STRATA_UPDATE_GOLDEN=1 rewrites the table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "support/tool.h"
#include "xla_device/core_ops.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::testing::CoreOpClass;

constexpr const char* kBegin = "<!-- core-ops-table:begin -->\n";
constexpr const char* kEnd = "<!-- core-ops-table:end -->";

std::string docs_path() {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  return std::string(source != nullptr ? source : ".") + "/docs/xla.md";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CoreOpsTest, ListIsTheInstalledTorchs) {
  if (strata::testing::project_python().empty()) GTEST_SKIP() << "no STRATA_PYTHON to run scripts/core_aten_ops.py";
  auto outcome = strata::testing::run_python("scripts/core_aten_ops.py", {"--check"});
  EXPECT_EQ(outcome.status, 0) << outcome.out << outcome.err;
}

TEST(CoreOpsTest, ListHasTheCoreOpsModelsAreMadeOf) {
  const auto ops = strata::testing::core_op_list();
  EXPECT_GT(ops.size(), 150u);
  for (const char* op : {"aten::add.Tensor", "aten::convolution", "aten::_native_batch_norm_legit", "aten::mm",
                         "aten::_log_softmax", "aten::max_pool2d_with_indices", "aten::sigmoid"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
}

class CoreOpsDispatcherTest : public strata::testing::XlaDeviceFixture {};

TEST_F(CoreOpsDispatcherTest, ClassifiesByTheKernelsRegistered) {
  using strata::testing::classify_core_op;
  // A kernel of strata's on the op itself, and on the .out form of a
  // structured op.
  EXPECT_EQ(classify_core_op("aten::native_layer_norm").kind, CoreOpClass::kLowered);
  auto add = classify_core_op("aten::add.Tensor");
  EXPECT_EQ(add.kind, CoreOpClass::kLowered);
  EXPECT_EQ(add.how, "through aten::add.out");
  // A CompositeExplicitAutograd op, and one no backend of this build has.
  EXPECT_EQ(classify_core_op("aten::full").kind, CoreOpClass::kDecomposed);
  auto absent = classify_core_op("aten::no_such_op");
  EXPECT_EQ(absent.kind, CoreOpClass::kRefused);
  EXPECT_EQ(absent.how, "not in this LibTorch's dispatcher");
}

TEST_F(CoreOpsDispatcherTest, DocsTableMatchesTheDispatcher) {
  const std::string table = strata::testing::core_ops_table(strata::testing::classify_core_ops());
  const std::string path = docs_path();
  std::string docs = read_all(path);
  const auto begin = docs.find(kBegin), end = docs.find(kEnd);
  ASSERT_NE(begin, std::string::npos) << path << " has no " << kBegin;
  ASSERT_NE(end, std::string::npos) << path << " has no " << kEnd;
  const auto from = begin + std::string(kBegin).size();
  if (std::getenv("STRATA_UPDATE_GOLDEN") != nullptr) {
    docs.replace(from, end - from, table);
    std::ofstream(path) << docs;
    return;
  }
  EXPECT_EQ(docs.substr(from, end - from), table)
      << "docs/xla.md's core op table differs from the dispatcher: rerun with STRATA_UPDATE_GOLDEN=1";
}

}  // namespace
