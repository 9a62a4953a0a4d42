// The one place that includes c10d's ProcessGroupGloo.hpp. Compiled without
// the precompiled header, with USE_C10D_GLOO (the header's guard; every
// LibTorch with distributed support is built with it) and, when LibTorch
// ships no Gloo headers, with strata's declarations in decl/.
#define USE_C10D_GLOO 1
#include "process_group_gloo.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace strata::comm::gloo {

c10::intrusive_ptr<c10d::Backend> make_process_group_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, const DeviceAddress& address,
                                                          std::chrono::milliseconds connect_timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(connect_timeout);
  options->devices.push_back(address.interface.empty()
                                 ? c10d::ProcessGroupGloo::createDeviceForHostname(address.hostname)
                                 : c10d::ProcessGroupGloo::createDeviceForInterface(address.interface));
  // strata issues one collective at a time per group (comm::Group's thread);
  // a second Gloo worker thread would only idle.
  options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace strata::comm::gloo
