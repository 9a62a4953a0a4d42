// A stand-in PJRT plugin for the loader's refusal paths: GetPjrtApi returns
// a table with the version (and size) compiled in, and no functions. Built
// three times by tests/CMakeLists.txt: too old a minor, another major, and
// a table too short to hold a version.
#include "pjrt_c_api.h"  // strata's private PJRT declarations (src/xla/)

namespace {
strata::xla::capi::PJRT_Api make_api() {
  strata::xla::capi::PJRT_Api api{};
  api.struct_size = MOCK_PJRT_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = strata::xla::capi::kStructSize<strata::xla::capi::PJRT_Api_Version>;
  api.pjrt_api_version.major_version = MOCK_PJRT_MAJOR;
  api.pjrt_api_version.minor_version = MOCK_PJRT_MINOR;
  return api;
}
const strata::xla::capi::PJRT_Api kApi = make_api();
}  // namespace

extern "C" __attribute__((visibility("default"))) const strata::xla::capi::PJRT_Api* GetPjrtApi() {
  return &kApi;
}
