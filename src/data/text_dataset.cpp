// TokenWindows: reading a file or a folder of files as byte tokens and
// cutting them into (input, target) windows.
#include "strata/data/text_dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "strata/core/error.h"

namespace strata::data {
namespace fs = std::filesystem;

namespace {

// The regular files under `root` (itself, if it is one), sorted by path.
std::vector<std::string> list_files(const std::string& root) {
  std::error_code ec;
  auto st = fs::status(root, ec);
  STRATA_CHECK(!ec && fs::exists(st), ConfigError, "[data] data path ", root,
               " does not exist; pass an existing file or folder of text");
  if (fs::is_regular_file(st)) return {root};
  STRATA_CHECK(fs::is_directory(st), ConfigError, "[data] data path ", root,
               " is neither a regular file nor a folder");
  std::vector<std::string> files;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  STRATA_CHECK(!ec, ConfigError, "[data] cannot list folder ", root, ": ", ec.message());
  for (; it != end; it.increment(ec)) {
    STRATA_CHECK(!ec, ConfigError, "[data] cannot list folder ", root, ": ", ec.message());
    std::error_code fec;
    if (it->is_regular_file(fec)) files.push_back(it->path().string());
  }
  // Note [File order]: directory iteration order is file-system dependent;
  // sorting by path makes the token stream (and so every window) the same
  // on every machine that has the same files.
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in.good(), ConfigError, "[data] cannot read ", path, ": ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  STRATA_CHECK(!in.bad(), ConfigError, "[data] error while reading ", path, ": ", std::strerror(errno));
  return bytes;
}

}  // namespace

TokenWindows::TokenWindows(const std::string& path, int64_t seq_len) : path_(path), seq_len_(seq_len) {
  STRATA_CHECK(seq_len >= 1, ConfigError, "[data] seq_len must be >= 1, got ", seq_len);
  std::string text;
  for (const auto& file : list_files(path)) {
    std::string bytes = read_file(file);
    if (bytes.empty()) continue;
    if (!text.empty()) text.push_back('\n');
    text += bytes;
    files_.push_back(file);
  }
  STRATA_CHECK(!text.empty(), ConfigError, "[data] data path ", path, " holds no data (0 bytes)");
  const auto n = static_cast<int64_t>(text.size());
  STRATA_CHECK(n >= seq_len + 1, ConfigError, "[data] data path ", path, " holds ", n,
               " bytes, fewer than one window of seq_len + 1 = ", seq_len + 1,
               " tokens; use a smaller seq_len or more text");
  tokens_ = at::empty({n}, at::kByte);
  std::memcpy(tokens_.data_ptr<uint8_t>(), text.data(), text.size());
}

size_t TokenWindows::size() const { return static_cast<size_t>((tokens_.numel() - 1) / seq_len_); }

Example TokenWindows::get(size_t index) const {
  STRATA_CHECK(index < size(), ConfigError, "[data] window index ", index, " is out of range for ", path_,
               " (", size(), " windows of ", seq_len_, " tokens)");
  auto window = tokens_.narrow(0, static_cast<int64_t>(index) * seq_len_, seq_len_ + 1).to(at::kLong);
  return {window.narrow(0, 0, seq_len_), window.narrow(0, 1, seq_len_)};
}

}  // namespace strata::data
