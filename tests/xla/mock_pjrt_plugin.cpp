// A stand-in PJRT plugin for the loader's refusal paths: GetPjrtApi returns
// a table with the version (and size) compiled in, and no functions. Built
// three times by tests/CMakeLists.txt: too old a minor, another major, and
// a table too short to hold a version.
#include "xla/pjrt/c/pjrt_c_api.h"  // XLA's header, vendored in third_party/pjrt/

namespace {
PJRT_Api make_api() {
  PJRT_Api api{};
  api.struct_size = MOCK_PJRT_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = MOCK_PJRT_MAJOR;
  api.pjrt_api_version.minor_version = MOCK_PJRT_MINOR;
  return api;
}
const PJRT_Api kApi = make_api();
}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  return &kApi;
}
