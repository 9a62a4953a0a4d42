// Opening plugins: every way a library can be refused, with the message
// the user sees, and the small parsers around the loader. The refusals use
// stand-in plugins (mock_pjrt_plugin.cpp); a real plugin is runtime_test's.
#include <gtest/gtest.h>

#include <cstdlib>

#include "strata/xla/client.h"
#include "strata/xla/plugin.h"
#include "support/errors.h"

namespace strata::xla {
namespace {

using strata::testing::error_message;

TEST(PluginTest, MissingFileIsNamedWithWhereThePathCameFrom) {
  const std::string message = error_message<XlaError>([] { Plugin::load("/nonexistent/libpjrt.so"); });
  EXPECT_EQ(message.rfind("[pjrt] cannot open the PJRT plugin /nonexistent/libpjrt.so: ", 0), 0u) << message;
  EXPECT_NE(message.find("(--plugin or STRATA_PJRT_PLUGIN)"), std::string::npos) << message;
}

TEST(PluginTest, LibraryWithoutGetPjrtApiIsNotAPlugin) {
  EXPECT_EQ(error_message<XlaError>([] { Plugin::load("libm.so.6"); }),
            "[pjrt] libm.so.6 is not a PJRT plugin: it does not export GetPjrtApi");
}

TEST(PluginTest, OlderPluginIsRefusedWithBothVersions) {
  const std::string path = STRATA_TEST_MOCK_PJRT_OLD;
  EXPECT_EQ(
      error_message<XlaError>([&] { Plugin::load(path); }),
      "[pjrt] " + path +
          ": plugin too old: the plugin has PJRT C API 0.50, strata was written against 0.81 and needs 0.81 "
          "or newer. Install a newer plugin.");
}

TEST(PluginTest, AnotherMajorVersionIsRefused) {
  const std::string path = STRATA_TEST_MOCK_PJRT_MAJOR1;
  EXPECT_EQ(error_message<XlaError>([&] { Plugin::load(path); }),
            "[pjrt] " + path +
                ": unsupported PJRT C API major version: the plugin has PJRT C API 1.90, strata was written "
                "against "
                "0.81. Use a plugin with major version 0.");
}

TEST(PluginTest, TableTooShortForAVersionIsRefused) {
  const std::string path = STRATA_TEST_MOCK_PJRT_SHORT;
  EXPECT_EQ(error_message<XlaError>([&] { Plugin::load(path); }),
            "[pjrt] " + path +
                ": the PJRT_Api table is 16 bytes, too small to hold a version; this is not a usable "
                "plugin");
}

TEST(PluginTest, NewerMinorAndTheSameMinorAreAccepted) {
  check_api_version({0, 81}, "p.so");
  check_api_version({0, 115}, "p.so");
  EXPECT_EQ(strata_api_version().major, 0);
  EXPECT_EQ(strata_api_version().minor, 81);
}

TEST(PluginTest, PathComesFromTheOptionThenTheEnvironment) {
  ::setenv("STRATA_PJRT_PLUGIN", "/from/env.so", 1);
  EXPECT_EQ(plugin_path_from("/from/option.so"), "/from/option.so");
  EXPECT_EQ(plugin_path_from(""), "/from/env.so");
  ::unsetenv("STRATA_PJRT_PLUGIN");
  const std::string message = error_message<ConfigError>([] { plugin_path_from(""); });
  EXPECT_EQ(message.rfind("[pjrt] no PJRT plugin given: pass --plugin PATH or set STRATA_PJRT_PLUGIN", 0), 0u)
      << message;
}

TEST(PluginTest, CreateOptionsParseByTheirValue) {
  EXPECT_EQ(std::get<int64_t>(parse_create_option("cpu_device_count=2").value), 2);
  EXPECT_EQ(std::get<bool>(parse_create_option("preallocate=false").value), false);
  EXPECT_FLOAT_EQ(std::get<float>(parse_create_option("memory_fraction=0.5").value), 0.5f);
  const NamedValue s = parse_create_option("allocator=platform");
  EXPECT_EQ(s.name, "allocator");
  EXPECT_EQ(std::get<std::string>(s.value), "platform");
  EXPECT_EQ(
      error_message<ConfigError>([] { parse_create_option("preallocate"); }),
      "[pjrt] create option 'preallocate' is not NAME=VALUE (e.g. cpu_device_count=2, preallocate=false)");
  EXPECT_EQ(value_text(std::vector<int64_t>{1, 20, 0}), "[1, 20, 0]");
}

TEST(PluginTest, KindComesFromTheFileNameAndSelectsTheOptionList) {
  EXPECT_EQ(plugin_kind("/x/jax_plugins/xla_cuda13/xla_cuda_plugin.so"), "cuda");
  EXPECT_EQ(plugin_kind("/x/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"), "cpu");
  EXPECT_EQ(plugin_kind("/usr/lib/libtpu.so"), "tpu");
  EXPECT_EQ(plugin_kind("/cuda/libsomething.so"), "");  // the directory does not count
  EXPECT_EQ(accepted_create_options("cpu"), (std::vector<std::string>{"cpu_device_count", "asynchronous"}));
  const auto& gpu = accepted_create_options("cuda");
  EXPECT_NE(std::find(gpu.begin(), gpu.end(), "preallocate"), gpu.end());
  EXPECT_TRUE(accepted_create_options("").empty());
}

TEST(PluginTest, StatusCodesHaveTheirAbslNames) {
  EXPECT_EQ(status_code_name(3), "INVALID_ARGUMENT");
  EXPECT_EQ(status_code_name(16), "UNAUTHENTICATED");
  EXPECT_EQ(status_code_name(99), "CODE_99");
}

}  // namespace
}  // namespace strata::xla
