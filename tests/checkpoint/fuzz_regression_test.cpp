// Replays the fuzz seed corpus (fuzz/corpus/) and every input a fuzzer
// ever crashed on (fuzz/regressions/<target>/) through the fuzz targets'
// entry points (fuzz/entry_points.h): each must be read or refused with a
// strata error, never crash or throw anything else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "entry_points.h"

namespace strata::fuzz {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const std::map<std::string, std::function<void(const uint8_t*, size_t)>>& targets() {
  static const std::map<std::string, std::function<void(const uint8_t*, size_t)>> t = {
      {"safetensors", safetensors_input}, {"metadata", metadata_input}, {"sharded", sharded_input}};
  return t;
}

// Feeds every file under fuzz/<folder>/<target>/ to the target; returns how many.
size_t replay(const std::string& folder) {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  EXPECT_NE(source, nullptr);
  size_t fed = 0;
  for (const auto& [name, fn] : targets()) {
    const fs::path dir = fs::path(source) / "fuzz" / folder / name;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file() || entry.path().filename().string()[0] == '.') continue;
      const std::string bytes = read_bytes(entry.path());
      SCOPED_TRACE(entry.path().string());
      EXPECT_NO_THROW(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      ++fed;
    }
  }
  return fed;
}

TEST(FuzzRegressionTest, SeedCorpusLoadsOrIsRefusedCleanly) { EXPECT_GT(replay("corpus"), 5u); }

TEST(FuzzRegressionTest, EveryRecordedCrashIsNowRefusedCleanly) { replay("regressions"); }

}  // namespace
}  // namespace strata::fuzz
