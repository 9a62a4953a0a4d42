// TokenFile: a memory-mapped file of uint16 token ids (nanoGPT's .bin) cut
// into (input, target) windows.
#include "strata/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "strata/core/error.h"

namespace strata::data {
namespace {

// Note [Token files are little-endian]
// nanoGPT writes numpy's uint16, which is little-endian on every machine
// it runs on; the ids are decoded byte by byte, so a big-endian host reads
// the same ids.
inline uint16_t id_at(const uint8_t* bytes, int64_t i) {
  return static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
}

}  // namespace

bool is_token_file(const std::string& path) {
  const std::string suffix = kTokenFileSuffix;
  return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TokenFile::TokenFile(const std::string& path, int64_t seq_len, int64_t vocab_size)
    : path_(path), seq_len_(seq_len), vocab_size_(vocab_size) {
  STRATA_CHECK(seq_len >= 1, ConfigError, "[data] seq_len must be >= 1, got ", seq_len);
  STRATA_CHECK(vocab_size >= 1, ConfigError, "[data] the vocabulary size of token file ", path,
               " must be >= 1, got ", vocab_size);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, ConfigError, "[data] cannot open token file ", path, ": ", std::strerror(errno),
               errno == ENOENT ? " (pass an existing .bin file of uint16 token ids)" : "");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int error = errno;
    ::close(fd);
    STRATA_CHECK(false, ConfigError, "[data] token file ", path, " is not a regular file",
                 S_ISDIR(st.st_mode) ? " but a folder (a token file is one .bin file of uint16 ids)"
                                     : (error ? std::string(": ") + std::strerror(error) : std::string()));
  }
  const auto bytes = static_cast<uint64_t>(st.st_size);
  if (bytes == 0 || bytes % 2 != 0) {
    ::close(fd);
    STRATA_CHECK(bytes != 0, ConfigError, "[data] token file ", path,
                 " is empty (0 bytes); write the ids with np.array(ids, dtype=np.uint16).tofile(path)");
    STRATA_CHECK(false, ConfigError, "[data] token file ", path, " holds ", bytes,
                 " bytes, an odd count: a .bin token file holds uint16 ids, 2 bytes each (nanoGPT's format); a "
                 "text file is read as bytes when its name does not end in .bin");
  }
  num_tokens_ = static_cast<int64_t>(bytes / 2);
  if (num_tokens_ < seq_len + 1) {
    ::close(fd);
    STRATA_CHECK(false, ConfigError, "[data] token file ", path, " holds ", num_tokens_,
                 " token ids, fewer than one window of seq_len + 1 = ", seq_len + 1,
                 " ids; use a smaller seq_len or more tokens");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping keeps the file
  STRATA_CHECK(map != MAP_FAILED, ConfigError, "[data] cannot map token file ", path, " (", bytes,
               " bytes): ", std::strerror(error));
  bytes_ = static_cast<const uint8_t*>(map);
  mapped_ = bytes;
  // Every id against the vocabulary, once (the class comment says why).
  uint16_t largest = 0;
  for (int64_t i = 0; i < num_tokens_; ++i) largest = std::max(largest, id_at(bytes_, i));
  if (largest >= vocab_size) {
    int64_t first = 0;
    while (id_at(bytes_, first) < vocab_size) ++first;
    const int64_t id = id_at(bytes_, first);
    ::munmap(map, mapped_);
    bytes_ = nullptr;
    STRATA_CHECK(false, ConfigError, "[data] token file ", path, ": token ", first, " (byte offset ", 2 * first,
                 ") is ", id, ", not below the vocabulary size ", vocab_size, " (the largest id is ", largest,
                 "); pass the tokenizer's vocabulary size, or check that the file holds uint16 ids");
  }
}

TokenFile::~TokenFile() {
  if (bytes_ != nullptr) ::munmap(const_cast<uint8_t*>(bytes_), mapped_);
}

size_t TokenFile::size() const { return static_cast<size_t>((num_tokens_ - 1) / seq_len_); }

at::Tensor TokenFile::ids(int64_t begin, int64_t count) const {
  STRATA_CHECK(begin >= 0 && count >= 0 && begin <= num_tokens_ - count, ConfigError, "[data] ids [", begin, ", ",
               begin + count, ") are out of range for token file ", path_, " (", num_tokens_, " ids)");
  at::Tensor out = at::empty({count}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) p[i] = id_at(bytes_, begin + i);
  return out;
}

Example TokenFile::get(size_t index) const {
  STRATA_CHECK(index < size(), ConfigError, "[data] window index ", index, " is out of range for ", path_, " (",
               size(), " windows of ", seq_len_, " tokens)");
  at::Tensor window = ids(static_cast<int64_t>(index) * seq_len_, seq_len_ + 1);
  return {window.narrow(0, 0, seq_len_), window.narrow(0, 1, seq_len_)};
}

}  // namespace strata::data
