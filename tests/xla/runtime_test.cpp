// strata's PJRT runtime on a real plugin: XLA's CPU plugin from the pinned
// lammps-jax-pjrt-cpu wheel (skipped, saying so, when it is not installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "strata/xla/client.h"
#include "support/errors.h"
#include "xla/torch_util.h"
#include "xla/xla_test_util.h"

namespace strata::testing {
namespace {

using xla::Client;
using xla::ClientOptions;
using xla::Plugin;
using xla::XlaError;

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cpu_plugin_path().empty()) GTEST_SKIP() << kNoCpuPlugin;
    plugin_ = Plugin::load(cpu_plugin_path());
  }
  std::shared_ptr<const Plugin> plugin_;
};

TEST_F(RuntimeTest, ReportsVersionAttributesPlatformAndDevices) {
  EXPECT_EQ(plugin_->version().major, 0);
  EXPECT_GE(plugin_->version().minor, 81);
  bool has_stablehlo_version = false;
  for (const xla::NamedValue& a : plugin_->attributes())
    has_stablehlo_version |= a.name == "stablehlo_current_version";
  EXPECT_TRUE(has_stablehlo_version);
  EXPECT_EQ(Plugin::load(cpu_plugin_path()).get(), plugin_.get()) << "a second load opens nothing new";

  Client client = Client::create(
      plugin_, ClientOptions().with_create_option("cpu_device_count", int64_t{2}).with_create_option("preallocate", false));
  EXPECT_EQ(client.platform_name(), "cpu");
  EXPECT_EQ(client.process_index(), 0);
  ASSERT_EQ(client.sent_options().size(), 1u);
  EXPECT_EQ(client.sent_options()[0].name, "cpu_device_count");
  EXPECT_EQ(client.dropped_options(), std::vector<std::string>{"preallocate"});
  const auto devices = client.devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].id, 0);
  EXPECT_EQ(devices[1].id, 1);
  EXPECT_EQ(devices[0].kind, "cpu");
  EXPECT_EQ(client.addressable_devices().size(), 2u);
}

TEST_F(RuntimeTest, EveryDtypeRoundTripsThroughTheDevice) {
  Client client = Client::create(plugin_);
  const xla::Device device = client.addressable_devices().at(0);
  for (ElementType type : xla::all_element_types()) {
    SCOPED_TRACE(std::string(xla::stablehlo_name(type)));
    HostTensor h{type, {2, 3}, {0, 1, 0, 1, 1, 0}};
    if (type != ElementType::kPred) h.values = {1, 2, 3, 4, 5, 127};
    if (xla::is_floating(type)) h.values = {-1.5, 0.25, 3, 1e-3, -0.0, 65504};
    const at::Tensor t = to_tensor(h).contiguous();
    const xla::Buffer buffer = client.buffer_from_host(t.data_ptr(), t.nbytes(), type, h.dims, device);
    EXPECT_EQ(buffer.element_type(), type);
    EXPECT_EQ(buffer.dims(), h.dims);
    EXPECT_EQ(buffer.byte_size(), t.nbytes());
    // Bytes, not values: LibTorch has no comparison kernels for uint16-64.
    const at::Tensor back = to_tensor(buffer);
    ASSERT_EQ(back.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(back.data_ptr(), t.data_ptr(), t.nbytes()), 0);
  }
  // A scalar and an empty tensor.
  const float scalar = 2.5f;
  const xla::Buffer s = client.buffer_from_host(&scalar, sizeof scalar, ElementType::kF32, {}, device);
  EXPECT_TRUE(s.dims().empty());
  EXPECT_EQ(to_tensor(s).item<float>(), 2.5f);
  const xla::Buffer empty = client.buffer_from_host(nullptr, 0, ElementType::kF32, {0, 4}, device);
  EXPECT_EQ(empty.dims(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty.byte_size(), 0u);
}

TEST_F(RuntimeTest, PluginErrorsCarryTheMessageAndTheCode) {
  Client client = Client::create(plugin_);
  try {
    client.compile("module { strata_not_an_op }", xla::CompileOptions{});
    FAIL() << "compiling nonsense succeeded";
  } catch (const XlaError& e) {
    const std::string message = e.what();
    EXPECT_NE(e.code(), 0);
    EXPECT_EQ(
        message.rfind("[pjrt] PJRT_Client_Compile failed (" + xla::status_code_name(e.code()) + "): ", 0), 0u)
        << message;
    EXPECT_NE(message.find("strata_not_an_op"), std::string::npos) << message;
  }
  const float values[3] = {1, 2, 3};
  EXPECT_EQ(error_message<ConfigError>([&] {
              client.buffer_from_host(values, sizeof values, ElementType::kF32, {4},
                                      client.addressable_devices()[0]);
            }),
            "[pjrt] buffer_from_host: 12 bytes given for 4 elements of f32 (16 bytes expected)");
}

TEST_F(RuntimeTest, ExecutableOutputsOutliveTheClientObject) {
  // Buffers and executables hold the client: destroying the Client object
  // first must leave them usable.
  std::vector<std::vector<xla::Buffer>> outputs;
  {
    Client client = Client::create(plugin_);
    Function f("main", {Type{ElementType::kF32, {2}}});
    f.returns({f.multiply(f.arg(0), f.arg(0))});
    Module m("square");
    m.add(f);
    const xla::LoadedExecutable exe = client.compile(m.text(), xla::CompileOptions{});
    EXPECT_EQ(exe.num_outputs(), 1u);
    const float in[2] = {3, -4};
    const xla::Buffer b =
        client.buffer_from_host(in, sizeof in, ElementType::kF32, {2}, client.addressable_devices()[0]);
    outputs = exe.execute({{&b}});
  }
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_TRUE(at::equal(to_tensor(outputs[0][0]), at::tensor({9.f, 16.f})));
}

// Note [Multi-process clients]: the CPU plugin makes one-process clients
// only, so asking it for two processes is refused before the plugin is
// called, saying what to do instead; node ids never go in as raw options.
TEST_F(RuntimeTest, AClientOfSeveralProcessesNeedsAPluginThatSpansThem) {
  EXPECT_FALSE(xla::supports_multi_process("cpu"));
  EXPECT_TRUE(xla::supports_multi_process("cuda"));
  const auto dir = std::filesystem::temp_directory_path() / ("strata-kv-" + std::to_string(::getpid()));
  std::string message = error_message<ConfigError>(
      [&] { Client::create(plugin_, ClientOptions().multi_process(1, 2, xla::directory_store(dir.string()))); });
  EXPECT_NE(message.find("makes one-process clients only, so it cannot span 2 processes"), std::string::npos)
      << message;
  EXPECT_NE(message.find("cpu_device_count=N"), std::string::npos) << message;
  message = error_message<ConfigError>(
      [&] { Client::create(plugin_, ClientOptions().with_create_option("num_nodes", int64_t{2})); });
  EXPECT_NE(message.find("set ClientOptions::multi_process instead"), std::string::npos) << message;
  message = error_message<ConfigError>([&] { Client::create(plugin_, ClientOptions().multi_process(2, 2, nullptr)); });
  EXPECT_NE(message.find("node_id 2 of num_nodes 2"), std::string::npos) << message;
  std::filesystem::remove_all(dir);
}

// The probe's store: a value set by one process is read by another, a get
// waits for a key set later, a key never set is nullopt after the timeout,
// and keys with the plugins' slashes and colons are file-safe.
TEST(DirectoryStoreTest, SetsGetsWaitsAndTimesOut) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata-kv-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto store = xla::directory_store(dir.string());
  const std::string key = "gpu:local_topology/cuda/0";
  store->set(key, std::string("topology\0bytes", 14));
  EXPECT_EQ(xla::directory_store(dir.string())->get(key, std::chrono::milliseconds(0)),
            std::string("topology\0bytes", 14));
  EXPECT_EQ(store->get("never/set", std::chrono::milliseconds(30)), std::nullopt);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store->set("gpu:global_topology/cuda", "all");
  });
  EXPECT_EQ(store->get("gpu:global_topology/cuda", std::chrono::seconds(10)), "all");
  later.join();
  store->set(key, "overwritten");
  EXPECT_EQ(store->get(key, std::chrono::milliseconds(0)), "overwritten");
  EXPECT_NE(error_message<ConfigError>([&] { store->set(std::string(200, 'k'), "v"); }).find("too large"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::testing
