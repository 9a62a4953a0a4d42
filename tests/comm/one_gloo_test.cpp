// strata runs the Gloo inside LibTorch and no other: after a 2-rank
// all-reduce over the gloo backend, each worker lists the shared objects
// loaded in its process and looks up where Gloo's entry points live.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <link.h>

#include <iostream>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/runtime/env.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace strata::comm {
namespace {

std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && *info->dlpi_name) {
          static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  return names;
}

std::string basename_of(const std::string& path) { return path.substr(path.rfind('/') + 1); }

/// The object that defines `symbol` for this process, or "" when none does.
std::string defined_in(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

STRATA_WORKER(one_gloo) {
  ProcessGroupOptions options;
  options.backend = "gloo";  // "auto" would pick shared memory on one host
  Group g = init_process_group(runtime::Environment::from_env(), options);
  at::Tensor t = at::full({8}, static_cast<double>(g.rank() + 1));
  g.all_reduce(t, ReduceOp::kSum);
  if (g.backend_name() != "gloo" || !at::equal(t, at::full({8}, 3.0))) {
    std::cerr << "all_reduce over " << g.backend_name() << " gave " << t << "\n";
    return 1;
  }
  for (const std::string& name : loaded_objects()) {
    if (basename_of(name).find("gloo") != std::string::npos) std::cout << "gloo object: " << name << "\n";
  }
  // Gloo's TCP device factory and its Context constructor (C++ names
  // mangled: gloo::transport::tcp::CreateDevice(attr const&),
  // gloo::Context::Context(int, int, int)).
  for (const char* symbol : {"_ZN4gloo9transport3tcp12CreateDeviceERKNS1_4attrE", "_ZN4gloo7ContextC1Eiii"}) {
    std::cout << "defined in: " << basename_of(defined_in(symbol)) << "\n";
  }
  return 0;
}

TEST(OneGloo, TheOnlyGlooLoadedIsTheOneInsideLibTorch) {
  testing::WorkersResult result = testing::run_workers(2, "one_gloo");
  ASSERT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  EXPECT_EQ(result.output.find("gloo object:"), std::string::npos) << result.output;
  for (int r = 0; r < 2; ++r) {
    const std::string prefix = "[rank " + std::to_string(r) + "] defined in: ";
    size_t at = 0, found = 0;
    while ((at = result.output.find(prefix, at)) != std::string::npos) {
      at += prefix.size();
      EXPECT_EQ(result.output.substr(at, result.output.find('\n', at) - at), "libtorch_cpu.so") << result.output;
      ++found;
    }
    EXPECT_EQ(found, 2u) << result.output;
  }
}

}  // namespace
}  // namespace strata::comm
