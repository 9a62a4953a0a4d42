// The rendezvous store: set/get/add/check/wait between real processes, and
// the errors a user meets (port in use, unreachable master, missing key).
#include <gtest/gtest.h>

#include <iostream>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using namespace std::chrono_literals;
using strata::runtime::Environment;
using strata::runtime::make_tcp_store;
using strata::runtime::Store;
using strata::runtime::TcpStoreOptions;

// Every rank publishes a value, counts itself in, and reads every other
// rank's value through the rendezvous store that rank 0 hosts.
STRATA_WORKER(store_exchange) {
  Environment env = Environment::from_env();
  auto store = strata::runtime::make_store(env, std::chrono::seconds(env.timeout_s));
  auto scoped = strata::runtime::prefix_store(store, "job");
  // Count in before publishing: once every value is visible, every rank has counted.
  int64_t after_me = store->add("joined", 1);
  scoped->set("value/" + std::to_string(env.rank), "from rank " + std::to_string(env.rank));
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("job/value/" + std::to_string(r));
  store->wait(keys, 30s);
  std::string seen;
  for (int r = 0; r < env.world_size; ++r) seen += "[" + scoped->get("value/" + std::to_string(r)) + "]";
  bool all = store->check(keys);
  bool missing = store->check({"job/never"});
  int64_t total = store->add("joined", 0);
  std::cout << "rank " << env.rank << " saw " << seen << " all=" << all << " missing=" << missing
            << " total=" << total << " after_me_ok=" << (after_me >= 1 && after_me <= env.world_size) << std::endl;
  // Rank 0 hosts the store: it leaves only after every rank is done with it.
  store->set("finished/" + std::to_string(env.rank), "1");
  if (env.rank == 0) {
    std::vector<std::string> finished;
    for (int r = 0; r < env.world_size; ++r) finished.push_back("finished/" + std::to_string(r));
    store->wait(finished, 30s);
  }
  return 0;
}

TEST(StoreTest, RanksExchangeValuesThroughTheStoreRankZeroHosts) {
  auto result = strata::testing::run_workers(3, "store_exchange", {}, strata::runtime::LaunchOptions().with_timeout_s(30));
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  for (int r = 0; r < 3; ++r) {
    std::string line = "[rank " + std::to_string(r) + "] rank " + std::to_string(r) +
                       " saw [from rank 0][from rank 1][from rank 2] all=1 missing=0 total=3 after_me_ok=1\n";
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "not in:\n" << result.output;
  }
}

std::shared_ptr<Store> host(int port = 0, std::chrono::milliseconds timeout = 5s) {
  TcpStoreOptions options;
  options.port = port;
  options.is_server = true;
  options.timeout = timeout;
  return make_tcp_store(options);
}

TEST(StoreTest, SetGetAddRemoveInOneProcess) {
  auto store = host();
  store->set("a", std::string("x\0y", 3));
  EXPECT_EQ(store->get("a"), std::string("x\0y", 3));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_TRUE(store->check({"a", "n"}));
  EXPECT_TRUE(store->remove("a"));
  EXPECT_FALSE(store->remove("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->timeout(), 5s);
}

TEST(StoreTest, PortInUseIsACommErrorNamingHostAndPort) {
  int port = strata::runtime::find_free_port();
  auto first = host(port);
  try {
    host(port);
    FAIL() << "no error";
  } catch (const strata::CommError& e) {
    EXPECT_EQ(dynamic_cast<const strata::TimeoutError*>(&e), nullptr);
    std::string expected = "[store] cannot host the rendezvous store on 127.0.0.1:" + std::to_string(port) +
                           ": the port is in use by another strata job (its rendezvous store answers there); give "
                           "this job another port (--master-port or MASTER_PORT), or leave both unset for a free "
                           "port on one host";
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(StoreTest, UnreachableMasterIsATimeoutErrorNamingHostAndPort) {
  int port = strata::runtime::find_free_port();  // nothing listens there
  TcpStoreOptions options;
  options.port = port;
  options.timeout = 1000ms;
  try {
    make_tcp_store(options);
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    std::string expected = "[store] could not reach the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                           " within 1000 ms; check MASTER_ADDR and MASTER_PORT, and that rank 0 has started";
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(StoreTest, GetOfAKeyNobodySetsTimesOutNamingTheKeyAndTheStoreStillWorks) {
  auto store = host(0, 300ms);
  try {
    store->get("missing/key");
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("[store] get('missing/key') timed out after 300 ms on 127.0.0.1:", 0), 0u) << what;
    EXPECT_NE(what.find("no worker set 'missing/key'"), std::string::npos) << what;
  }
  // The key appears after the timeout: later calls must get their own answers.
  store->set("missing/key", "late");
  EXPECT_EQ(store->add("counter", 7), 7);
  EXPECT_EQ(store->get("missing/key"), "late");
}

TEST(StoreTest, WaitNamesOnlyTheKeysStillMissing) {
  auto store = host();
  store->set("here", "1");
  try {
    store->wait({"here", "absent"}, 200ms);
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("wait('here', 'absent') timed out after 200 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("no worker set 'absent';"), std::string::npos) << what;
  }
}

TEST(StoreTest, PrefixStoreKeepsNamespacesApart) {
  auto store = host();
  auto a = strata::runtime::prefix_store(store, "a");
  auto b = strata::runtime::prefix_store(store, "b");
  a->set("k", "in a");
  b->set("k", "in b");
  EXPECT_EQ(a->get("k"), "in a");
  EXPECT_EQ(b->get("k"), "in b");
  EXPECT_EQ(store->get("a/k"), "in a");
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_FALSE(b->check({"n"}));
}

TEST(StoreTest, MultiProcessEnvironmentWithoutPortIsAConfigError) {
  Environment env;
  env.world_size = 2;
  env.rank = 1;
  env.source = "strata";
  try {
    strata::runtime::make_store(env, 1s);
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT is not set"), std::string::npos) << e.what();
  }
}

TEST(StoreTest, FreePortCanBeBound) {
  int port = strata::runtime::find_free_port();
  EXPECT_GT(port, 0);
  auto store = host(port);  // the port is usable for a store
  store->set("k", "v");
  EXPECT_EQ(store->get("k"), "v");
}

}  // namespace
