#include <gtest/gtest.h>

#include <cerrno>
#include <fcntl.h>

#include "strata/core/error.h"

namespace {

TEST(ErrorTest, CheckThrowsTheNamedTypeWithTheMessage) {
  int devices = 0;
  try {
    STRATA_CHECK(devices > 0, ConfigError, "[fabric] devices must be > 0, got ", devices);
    FAIL() << "STRATA_CHECK did not throw";
  } catch (const strata::ConfigError& e) {
    EXPECT_STREQ(e.what(), "[fabric] devices must be > 0, got 0");
  }
}

TEST(ErrorTest, TimeoutIsACommErrorAndEveryErrorIsAStrataError) {
  EXPECT_THROW(throw strata::TimeoutError("t"), strata::CommError);
  EXPECT_THROW(throw strata::CheckpointError("c"), strata::Error);
  EXPECT_THROW(throw strata::LaunchError("l"), strata::Error);
}

TEST(ErrorTest, SyscallCheckNamesTheCallAndErrno) {
  try {
    STRATA_CHECK_SYSCALL(::open("/nonexistent/strata/file", O_RDONLY), CheckpointError,
                         "[checkpoint] cannot open /nonexistent/strata/file");
    FAIL() << "STRATA_CHECK_SYSCALL did not throw";
  } catch (const strata::CheckpointError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("[checkpoint] cannot open /nonexistent/strata/file"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
    EXPECT_NE(what.find("errno 2"), std::string::npos) << what;
  }
}

TEST(ErrorTest, AssertCarriesFileAndLine) {
  try {
    STRATA_ASSERT(1 + 1 == 3, "arithmetic");
    FAIL();
  } catch (const strata::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("1 + 1 == 3"), std::string::npos) << what;
  }
}

}  // namespace
