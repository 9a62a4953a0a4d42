// `strata xla-probe` as users run it: end to end on XLA's CPU plugin, and
// the errors when no plugin, or an unusable one, is given.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

#include "support/tool.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

TEST(XlaProbeCliTest, RunsEndToEndOnTheCpuPluginAndMatchesLibTorch) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  const Outcome o = run_strata({"xla-probe", "--plugin", cpu_plugin_path(), "--option", "preallocate=false"});
  ASSERT_EQ(o.status, 0) << o.out << o.err;
  const nlohmann::json report = nlohmann::json::parse(o.out);
  EXPECT_EQ(report["ok"], true);
  EXPECT_EQ(report["reference"], "libtorch");
  EXPECT_EQ(report["plugin_kind"], "cpu");
  EXPECT_EQ(report["platform"], "cpu");
  EXPECT_EQ(report["strata_pjrt_api_version"], "0.81");
  EXPECT_EQ(report["pjrt_api_version"].get<std::string>().rfind("0.", 0), 0u);
  EXPECT_EQ(report["create_options_sent"], nlohmann::json({{"cpu_device_count", 2}}));
  EXPECT_EQ(report["create_options_dropped"], nlohmann::json::array({"preallocate"}));
  EXPECT_EQ(report["devices"].size(), 2u);
  EXPECT_TRUE(report["attributes"].contains("stablehlo_current_version"));
  ASSERT_EQ(report["cases"].size(), 3u);
  const std::vector<std::string> names = {"add", "matmul", "all_reduce"};
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& c = report["cases"][i];
    EXPECT_EQ(c["name"], names[i]);
    EXPECT_EQ(c["passed"], true) << c.dump();
    EXPECT_LT(c["max_abs_diff"].get<double>(), 1e-4) << c.dump();
    EXPECT_EQ(c["outputs"].size(), c["expected"].size()) << c.dump();
  }
  EXPECT_EQ(report["cases"][2]["replicas"], 2);
  EXPECT_EQ(report["cases"][2]["outputs"].size(), 2u);
}

TEST(XlaProbeCliTest, WithoutAPluginTheErrorSaysHowToGiveOne) {
  ::unsetenv("STRATA_PJRT_PLUGIN");
  const Outcome o = run_strata({"xla-probe"});
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(
      o.err.find("strata: error: [pjrt] no PJRT plugin given: pass --plugin PATH or set STRATA_PJRT_PLUGIN"),
      std::string::npos)
      << o.err;
}

TEST(XlaProbeCliTest, AnOlderPluginIsRefusedBeforeAnyCall) {
  const Outcome o = run_strata({"xla-probe", "--plugin", STRATA_TEST_MOCK_PJRT_OLD});
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.err.find("plugin too old: the plugin has PJRT C API 0.50, strata was written against 0.81"),
            std::string::npos)
      << o.err;
  EXPECT_TRUE(o.out.empty()) << o.out;
}

}  // namespace
}  // namespace strata::testing
