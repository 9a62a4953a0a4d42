// Every program strata's builder emits (tests/xla/catalogue.h) runs on two
// independent XLA runtimes and must give what LibTorch gives on the host:
//  - JAX's CPU backend (tests/xla/jax_oracle.py; skipped when jax is not
//    installed), with two forced host devices for the collectives. The same
//    run parses strata's CompileOptionsProto bytes with jaxlib's parser.
//  - strata's own PJRT runtime over the CPU plugin (skipped when the
//    plugin is not installed), with cpu_device_count=2.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "strata/xla/client.h"
#include "strata/xla/compile_options.h"
#include "xla/torch_util.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

nlohmann::json host_json(const HostTensor& h) {
  return {{"dtype", std::string(xla::stablehlo_name(h.dtype))}, {"dims", h.dims}, {"values", h.values}};
}

TEST(OracleTest, JaxRunsEveryEmittedProgramAsLibTorchDoes) {
  const std::string python = test_python();
  if (python.empty()) GTEST_SKIP() << "STRATA_PYTHON is not set: no Python to run jax with";
  const fs::path dir = fs::temp_directory_path() / ("strata-xla-oracle-" + std::to_string(::getpid()));
  fs::create_directories(dir);

  const std::vector<CatalogueEntry> entries = catalogue();
  nlohmann::json request = {{"cases", nlohmann::json::array()}, {"compile_options", nlohmann::json::array()}};
  for (const CatalogueEntry& e : entries) {
    nlohmann::json inputs = nlohmann::json::array();
    for (const auto& replica : e.inputs) {
      nlohmann::json args = nlohmann::json::array();
      for (const HostTensor& h : replica) args.push_back(host_json(h));
      inputs.push_back(args);
    }
    request["cases"].push_back(
        {{"name", e.name}, {"module", e.module}, {"replicas", e.replicas}, {"inputs", inputs}});
  }
  const xla::CompileOptions one{};
  xla::CompileOptions two;
  two.with_num_replicas(2).with_device_assignment({{0}, {1}});
  request["compile_options"].push_back({{"name", "default"}, {"hex", hex(one.serialize())}});
  request["compile_options"].push_back({{"name", "two_replicas"}, {"hex", hex(two.serialize())}});
  // Note [Explicit counts] in compile_options.cpp: a proto without
  // num_replicas means 0 replicas to XLA, which is why strata always writes it.
  request["compile_options"].push_back({{"name", "no_counts"}, {"hex", "1a0b08ffffffffffffffffff01"}});
  std::ofstream(dir / "request.json") << request.dump();

  std::string output;
  const std::string command = python + " " + xla_test_file("jax_oracle.py") + " " +
                              (dir / "request.json").string() + " " + (dir / "result.json").string() +
                              " 2>&1";
  ASSERT_EQ(run_command(command, output), 0) << output;
  std::ifstream in(dir / "result.json");
  const nlohmann::json result = nlohmann::json::parse(in);
  fs::remove_all(dir);
  if (result.contains("skip")) GTEST_SKIP() << result["skip"].get<std::string>();

  ASSERT_EQ(result["cases"].size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const CatalogueEntry& e = entries[i];
    const nlohmann::json& got = result["cases"][i];
    SCOPED_TRACE(e.name + " (jax " + result["jax"].get<std::string>() + ")");
    ASSERT_FALSE(got.contains("error")) << got["error"];
    const auto want = libtorch_reference(e);
    ASSERT_EQ(got["outputs"].size(), want.size());
    for (size_t r = 0; r < want.size(); ++r) {
      ASSERT_EQ(got["outputs"][r].size(), want[r].size());
      for (size_t o = 0; o < want[r].size(); ++o)
        expect_same(tensor_from_json(got["outputs"][r][o]), want[r][o],
                    e.name + " replica " + std::to_string(r) + " output " + std::to_string(o));
    }
  }

  // jaxlib's own parser reads what the encoder wrote.
  const nlohmann::json& parsed = result["compile_options"];
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0]["num_replicas"], 1);
  EXPECT_EQ(parsed[0]["num_partitions"], 1);
  EXPECT_EQ(parsed[0]["device_assignment"], "");
  EXPECT_EQ(parsed[1]["num_replicas"], 2);
  EXPECT_EQ(parsed[1]["num_partitions"], 1);
  EXPECT_EQ(parsed[1]["device_assignment"],
            "DeviceAssignment{replica_count=2, computation_count=1, Computation0{0 1}}");
  EXPECT_EQ(parsed[2]["num_replicas"], 0);
}

TEST(OracleTest, CpuPluginRunsEveryEmittedProgramAsLibTorchDoes) {
  if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
  auto plugin = xla::Plugin::load(cpu_plugin_path());
  xla::Client client =
      xla::Client::create(plugin, xla::ClientOptions().with_create_option("cpu_device_count", int64_t{2}));
  const std::vector<xla::Device> devices = client.addressable_devices();
  ASSERT_EQ(devices.size(), 2u);

  for (const CatalogueEntry& e : catalogue()) {
    SCOPED_TRACE(e.name);
    xla::CompileOptions options;
    options.with_num_replicas(e.replicas);
    for (int r = 0; r < e.replicas; ++r) options.device_assignment.push_back({devices[r].id});
    xla::LoadedExecutable exe = client.compile(e.module, options);

    std::vector<std::vector<xla::Buffer>> inputs(e.replicas);
    std::vector<std::vector<const xla::Buffer*>> arguments(e.replicas);
    for (int r = 0; r < e.replicas; ++r) {
      for (const HostTensor& h : e.inputs[r]) {
        const at::Tensor t = to_tensor(h).contiguous();
        inputs[r].push_back(client.buffer_from_host(t.data_ptr(), t.nbytes(), h.dtype, h.dims, devices[r]));
      }
      for (const xla::Buffer& b : inputs[r]) arguments[r].push_back(&b);
    }
    const auto outputs = exe.execute(arguments);
    const auto want = libtorch_reference(e);
    ASSERT_EQ(outputs.size(), want.size());
    for (size_t r = 0; r < want.size(); ++r) {
      ASSERT_EQ(outputs[r].size(), want[r].size());
      for (size_t o = 0; o < want[r].size(); ++o)
        expect_same(to_tensor(outputs[r][o]), want[r][o],
                    e.name + " replica " + std::to_string(r) + " output " + std::to_string(o));
    }
  }
}

}  // namespace
}  // namespace strata::testing
