// Helpers shared by the checkpoint tests: scratch directories and raw files.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace strata::checkpoint::testing {

/// A fresh directory under the test temp dir, removed with its contents
/// when the fixture ends.
class ScratchDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "strata_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  /// `name` inside the scratch directory.
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  /// Entry names in the scratch directory (sorted).
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

/// The bytes of a file.
/// A pid that ran here and has exited (a reaped child): no process has it.
inline pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Writes `bytes` to `path` as is.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors-like file: the 8-byte little-endian `length` (by default
/// the header's size), the header text, then `buffer` bytes.
inline std::string raw_safetensors(const std::string& header, const std::string& buffer,
                                   uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return out + header + buffer;
}

}  // namespace strata::checkpoint::testing
