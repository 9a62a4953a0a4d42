// The PJRT header strata builds with (third_party/pjrt/, vendored from the
// xla-cpu-pjrt wheel) is the published one: byte for byte the header the
// pinned wheel ships, when the wheel is installed (CMake finds it in the
// venv, or takes -DSTRATA_PJRT_HEADER=PATH), and the version the loader
// requires of plugins is that header's.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "pjrt_api.h"
#include "strata/xla/plugin.h"

namespace strata::xla {
namespace {

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(PjrtHeaderTest, VendoredHeaderIsThePublishedOne) {
#ifdef STRATA_PJRT_PACKAGED_HEADER
  const std::string vendored = contents(STRATA_PJRT_VENDORED_HEADER);
  ASSERT_FALSE(vendored.empty());
  EXPECT_TRUE(vendored == contents(STRATA_PJRT_PACKAGED_HEADER))
      << STRATA_PJRT_VENDORED_HEADER << " differs from " << STRATA_PJRT_PACKAGED_HEADER
      << ": vendor the published header unmodified and record its version in third_party/pjrt/README.md";
#else
  GTEST_SKIP() << "no packaged pjrt_c_api.h was found at configure time (pip install the xla-cpu-pjrt pinned in "
                  "scripts/requirements.txt, or configure with -DSTRATA_PJRT_HEADER=PATH)";
#endif
}

TEST(PjrtHeaderTest, PluginsMustBeAtLeastTheHeadersVersion) {
  EXPECT_EQ(strata_api_version().major, PJRT_API_MAJOR);
  EXPECT_EQ(strata_api_version().minor, PJRT_API_MINOR);
  EXPECT_EQ(PJRT_API_MAJOR, 0);
  EXPECT_EQ(PJRT_API_MINOR, 81);  // third_party/pjrt/README.md
  EXPECT_NO_THROW(check_api_version({0, PJRT_API_MINOR}, "same.so"));
  EXPECT_NO_THROW(check_api_version({0, PJRT_API_MINOR + 30}, "newer.so"));
  EXPECT_THROW(check_api_version({0, PJRT_API_MINOR - 1}, "older.so"), XlaError);
  EXPECT_THROW(check_api_version({1, 0}, "major1.so"), XlaError);
}

}  // namespace
}  // namespace strata::xla
