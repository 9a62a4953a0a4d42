// A multi-process PJRT client's key-value store on the job's rendezvous
// store (strata/xla_device/rendezvous.h): what one process sets another reads,
// under "pjrt/", a get waits for a key set later, and a key never set is
// nullopt after the timeout (the plugin then names it).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "strata/runtime/store.h"
#include "strata/xla_device/rendezvous.h"

namespace {

using strata::runtime::TcpStoreOptions;

TEST(RendezvousKeyValuesTest, TheClientsKeysGoThroughTheJobsStore) {
  TcpStoreOptions host;
  host.port = strata::runtime::find_free_port();
  host.is_server = true;
  host.timeout = std::chrono::seconds(10);
  auto server = strata::runtime::make_tcp_store(host);
  TcpStoreOptions other = host;
  other.is_server = false;
  auto client = strata::runtime::make_tcp_store(other);

  auto here = strata::xla::rendezvous_key_values(server);
  auto there = strata::xla::rendezvous_key_values(client);
  here->set("gpu:local_topology/cuda/0", std::string("\x01\x00topology", 10));
  EXPECT_EQ(there->get("gpu:local_topology/cuda/0", std::chrono::milliseconds(0)),
            std::string("\x01\x00topology", 10));
  EXPECT_EQ(client->get("pjrt/gpu:local_topology/cuda/0"), std::string("\x01\x00topology", 10));

  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    there->set("gpu:global_topology/cuda", "every device");
  });
  EXPECT_EQ(here->get("gpu:global_topology/cuda", std::chrono::seconds(5)), "every device");
  later.join();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(here->get("never/set", std::chrono::milliseconds(200)), std::nullopt);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  EXPECT_EQ(here->get("never/set", std::chrono::milliseconds(0)), std::nullopt);
}

}  // namespace
