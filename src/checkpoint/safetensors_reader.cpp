// The safetensors reader (format: include/strata/checkpoint/safetensors.h).
//
// The reader trusts nothing in the file: every length and offset is checked
// against the file size before a byte of tensor data is read, so a damaged
// file is a CheckpointError that names the file, the key and the problem,
// never a crash or a huge allocation.
#include "strata/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_set>
#include <set>
#include <tuple>
#include <unordered_map>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/checksum.h"
#include "strata/checkpoint/input.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "safetensors_format.h"

namespace strata::checkpoint {

using namespace safetensors_format;
using ::strata::detail::cat;

struct SafetensorsFile::Impl {
  std::string path;
  int fd = -1;
  uint64_t data_start = 0;  // file offset of the data buffer
  bool verify = true;
  bool has_checksums = false;
  std::vector<std::string> keys;
  std::unordered_map<std::string, TensorInfo> infos;
  Metadata metadata;
  // Tensors whose whole bytes were checked already (load_flat of a part
  // checks the whole tensor once).
  mutable std::mutex verified_mutex;
  mutable std::unordered_set<std::string> verified;
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

bool ReadOptions::default_verify_checksums() {
  const char* env = std::getenv("STRATA_CKPT_VERIFY");
  return env == nullptr || std::string(env) != "0";
}

namespace {

// Reads exactly `size` bytes at `offset`; returns the number read before
// end of file (less than `size` only when the file is shorter).
size_t pread_full(int fd, void* out, size_t size, uint64_t offset, const std::string& path) {
  size_t done = 0;
  auto* bytes = static_cast<char*>(out);
  while (done < size) {
    const size_t chunk = std::min<size_t>(size - done, size_t(1) << 30);
    ssize_t n = ::pread(fd, bytes + done, chunk, static_cast<off_t>(offset + done));
    if (n == -1 && errno == EINTR) continue;
    STRATA_CHECK_SYSCALL(n, CheckpointError, "[checkpoint] ", path, ": reading ", size,
                         " bytes at offset ", offset);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// Parses the JSON header within the header limits (input.h): a key repeated
// in an object is an error (nlohmann would silently keep the last one).
nlohmann::json parse_header(const std::string& text, const std::string& path) {
  nlohmann::json header;
  try {
    header = parse_json_limited(text, header_json_limits(), path, "the header");
  } catch (const CheckpointError& e) {
    throw CheckpointError(cat(e.what(), "; the file is corrupt or not a safetensors file"));
  }
  STRATA_CHECK(header.is_object(), CheckpointError, "[checkpoint] ", path,
               ": the header is JSON but not an object (", header.type_name(), ")");
  return header;
}

// Largest dimension and largest byte count of a tensor: far above any real
// tensor, far below where int64 arithmetic on shapes could overflow.
constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 62;

uint64_t json_u64(const nlohmann::json& value, const std::string& path, const std::string& key,
                  const char* field) {
  STRATA_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
               CheckpointError, "[checkpoint] ", path, ": tensor '", key, "' has ", field, " ",
               value.dump(), "; expected a non-negative integer");
  return value.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& key, const nlohmann::json& entry, const std::string& path) {
  STRATA_CHECK(entry.is_object(), CheckpointError, "[checkpoint] ", path, ": tensor '", key,
               "' has entry ", entry.dump(), "; expected an object with dtype, shape, data_offsets");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    STRATA_CHECK(entry.contains(field), CheckpointError, "[checkpoint] ", path, ": tensor '", key,
                 "' has no \"", field, "\"");
  TensorInfo info;
  info.spec.name = key;
  const auto& dtype = entry["dtype"];
  STRATA_CHECK(dtype.is_string(), CheckpointError, "[checkpoint] ", path, ": tensor '", key,
               "' has dtype ", dtype.dump(), "; expected a string such as \"F32\"");
  try {
    info.spec.dtype = dtype_from_name(dtype.get<std::string>());
  } catch (const CheckpointError& e) {
    throw CheckpointError(cat("[checkpoint] ", path, ": tensor '", key, "': ",
                              std::string(e.what()).substr(std::strlen("[checkpoint] "))));
  }
  const auto& shape = entry["shape"];
  STRATA_CHECK(shape.is_array(), CheckpointError, "[checkpoint] ", path, ": tensor '", key,
               "' has shape ", shape.dump(), "; expected an array of sizes");
  // numel * itemsize must not overflow, and neither may the product of the
  // non-zero dimensions (a [0, 2^64-1] tensor has no bytes, but no tensor
  // library can make it): bound both by 2^62 as we go.
  STRATA_CHECK(shape.size() <= 64, CheckpointError, "[checkpoint] ", path, ": tensor '", key,
               "' has ", shape.size(), " dimensions; at most 64 are supported");
  uint64_t bytes = c10::elementSize(info.spec.dtype);
  uint64_t nonzero = c10::elementSize(info.spec.dtype);
  for (const auto& dim : shape) {
    const uint64_t d = json_u64(dim, path, key, "a dimension");
    STRATA_CHECK(d == 0 || nonzero <= kMaxTensorBytes / d, CheckpointError, "[checkpoint] ", path,
                 ": tensor '", key, "' has shape ", shape.dump(), ", too large to exist");
    if (d != 0) nonzero *= d;
    bytes *= d;
    info.spec.shape.push_back(static_cast<int64_t>(d));
  }
  const auto& offsets = entry["data_offsets"];
  STRATA_CHECK(offsets.is_array() && offsets.size() == 2, CheckpointError, "[checkpoint] ", path,
               ": tensor '", key, "' has data_offsets ", offsets.dump(), "; expected [begin, end]");
  info.begin = json_u64(offsets[0], path, key, "data_offsets begin");
  info.end = json_u64(offsets[1], path, key, "data_offsets end");
  STRATA_CHECK(info.begin <= info.end, CheckpointError, "[checkpoint] ", path, ": tensor '", key,
               "' has data_offsets [", info.begin, ", ", info.end, "] with begin after end");
  STRATA_CHECK(info.end - info.begin == bytes, CheckpointError, "[checkpoint] ", path,
               ": tensor '", key, "' is ", dtype.get<std::string>(), " ",
               shape_string(info.spec.shape), " (", bytes, " bytes) but its data_offsets [",
               info.begin, ", ", info.end, "] span ", info.end - info.begin, " bytes");
  return info;
}

uint64_t parse_hex64(const std::string& text, const std::string& path) {
  uint64_t value = 0;
  for (char c : text) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    STRATA_CHECK(digit >= 0, CheckpointError, "[checkpoint] ", path, ": __metadata__ '",
                 kChecksumKey, "' holds '", c, "', not a lowercase hex digit");
    value = (value << 4) | uint64_t(digit);
  }
  return value;
}

// The XXH64 of `size` bytes at `offset`, read in bounded chunks.
uint64_t hash_range(int fd, uint64_t offset, uint64_t size, const std::string& path,
                    const std::string& key) {
  Xxh64 hash;
  std::vector<char> buffer(std::min<uint64_t>(size, uint64_t(4) << 20));
  uint64_t done = 0;
  while (done < size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size - done, buffer.size()));
    const size_t got = pread_full(fd, buffer.data(), chunk, offset + done, path);
    STRATA_CHECK(got == chunk, CheckpointError, "[checkpoint] ", path, ": tensor '", key,
                 "' needs ", size, " bytes but the file ended after ", done + got,
                 " of them (truncated after it was opened?)");
    hash.update(buffer.data(), chunk);
    done += chunk;
  }
  return hash.digest();
}

[[noreturn]] void checksum_mismatch(const std::string& path, const TensorInfo& info,
                                    uint64_t actual) {
  throw CheckpointError(cat("[checkpoint] ", path, ": tensor '", info.spec.name,
                            "': checksum mismatch: the file records xxh64 ", hex64(info.checksum),
                            " but its bytes hash to ", hex64(actual),
                            "; the data was changed or damaged after it was saved"));
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path, const ReadOptions& options) {
  check_little_endian();
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->verify = options.verify_checksums;
  impl->fd = open_regular_file(path);
  struct stat st {};
  STRATA_CHECK_SYSCALL(::fstat(impl->fd, &st), CheckpointError, "[checkpoint] ", path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  STRATA_CHECK(file_size >= 8, CheckpointError, "[checkpoint] ", path, ": the file is ", file_size,
               " bytes, too short for the 8-byte header length (truncated or not a safetensors "
               "file)");
  uint8_t length_bytes[8];
  STRATA_ASSERT(pread_full(impl->fd, length_bytes, 8, 0, path) == 8, "short read of ", path);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(length_bytes[i]) << (8 * i);
  STRATA_CHECK(header_len <= kMaxHeaderBytes, CheckpointError, "[checkpoint] ", path,
               ": header length ", header_len, " exceeds the ", kMaxHeaderBytes,
               "-byte limit (corrupt or not a safetensors file)");
  STRATA_CHECK(header_len <= file_size - 8, CheckpointError, "[checkpoint] ", path,
               ": header length ", header_len, " is more than the ", file_size - 8,
               " bytes that follow it (truncated or not a safetensors file)");
  std::string text(header_len, '\0');
  STRATA_ASSERT(pread_full(impl->fd, text.data(), header_len, 8, path) == header_len,
                "short read of ", path);
  const nlohmann::json header = parse_header(text, path);

  std::vector<TensorInfo> infos;
  std::string checksums;
  bool has_checksums = false;
  for (const auto& [key, entry] : header.items()) {
    if (key == kMetadataKey) {
      STRATA_CHECK(entry.is_object() || entry.is_null(), CheckpointError, "[checkpoint] ", path,
                   ": __metadata__ is ", entry.type_name(), "; expected an object of strings");
      if (entry.is_null()) continue;
      for (const auto& [mkey, value] : entry.items()) {
        STRATA_CHECK(value.is_string(), CheckpointError, "[checkpoint] ", path,
                     ": __metadata__ entry '", mkey, "' is ", value.dump(), "; expected a string");
        if (mkey == kChecksumKey) {
          checksums = value.get<std::string>();
          has_checksums = true;
          continue;
        }
        impl->metadata[mkey] = value.get<std::string>();
      }
      continue;
    }
    infos.push_back(parse_entry(key, entry, path));
  }

  // The tensors must tile the data buffer: sorted by offset, each begins
  // where the previous ended, and the last ends at the end of the file.
  // Stable: 0-byte tensors sharing an offset keep the header's (name) order.
  std::stable_sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  const uint64_t buffer_size = file_size - 8 - header_len;
  uint64_t expected = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& info = infos[i];
    STRATA_CHECK(info.begin >= expected, CheckpointError, "[checkpoint] ", path, ": tensor '",
                 info.spec.name, "' (bytes [", info.begin, ", ", info.end,
                 ")) overlaps tensor '", infos[i - 1].spec.name, "' (bytes [", infos[i - 1].begin,
                 ", ", infos[i - 1].end, "))");
    STRATA_CHECK(info.begin == expected, CheckpointError, "[checkpoint] ", path, ": tensor '",
                 info.spec.name, "' begins at byte ", info.begin, " of the data buffer, leaving a ",
                 "gap after byte ", expected);
    STRATA_CHECK(info.end <= buffer_size, CheckpointError, "[checkpoint] ", path, ": tensor '",
                 info.spec.name, "' needs bytes [", info.begin, ", ", info.end,
                 ") of the data buffer but the file has only ", buffer_size, " (truncated?)");
    expected = info.end;
  }
  STRATA_CHECK(expected == buffer_size, CheckpointError, "[checkpoint] ", path, ": the file has ",
               buffer_size - expected, " bytes after the last tensor's data (corrupt header?)");

  if (has_checksums) {
    STRATA_CHECK(checksums.size() == 16 * infos.size(), CheckpointError, "[checkpoint] ", path,
                 ": __metadata__ '", kChecksumKey, "' holds ", checksums.size(),
                 " hex digits; expected 16 for each of the ", infos.size(), " tensors");
    for (size_t i = 0; i < infos.size(); ++i) {
      infos[i].has_checksum = true;
      infos[i].checksum = parse_hex64(checksums.substr(16 * i, 16), path);
    }
  }
  impl->has_checksums = has_checksums;
  impl->data_start = 8 + header_len;
  for (auto& info : infos) {
    impl->keys.push_back(info.spec.name);
    impl->infos.emplace(info.spec.name, std::move(info));
  }
  SafetensorsFile file;
  file.impl_ = std::move(impl);
  return file;
}

const std::vector<std::string>& SafetensorsFile::keys() const { return impl_->keys; }

bool SafetensorsFile::contains(const std::string& key) const {
  return impl_->infos.count(key) != 0;
}

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  auto it = impl_->infos.find(key);
  STRATA_CHECK(it != impl_->infos.end(), CheckpointError, "[checkpoint] ", impl_->path,
               ": no tensor named '", key, "' (the file holds ", impl_->keys.size(), " tensors)");
  return it->second;
}

at::Tensor SafetensorsFile::load(const std::string& key) const {
  const TensorInfo& entry = info(key);
  at::Tensor out = at::empty(entry.spec.shape, at::TensorOptions().dtype(entry.spec.dtype));
  const uint64_t size = entry.end - entry.begin;
  if (size == 0) return out;
  const size_t got = pread_full(impl_->fd, out.data_ptr(), size, impl_->data_start + entry.begin,
                                impl_->path);
  STRATA_CHECK(got == size, CheckpointError, "[checkpoint] ", impl_->path, ": tensor '", key,
               "' needs ", size, " bytes but the file ended after ", got,
               " of them (truncated after it was opened?)");
  if (impl_->verify && entry.has_checksum) {
    const uint64_t actual = xxh64(out.data_ptr(), size);
    if (actual != entry.checksum) checksum_mismatch(impl_->path, entry, actual);
  }
  return out;
}

bool SafetensorsFile::has_checksums() const { return impl_->has_checksums; }

void SafetensorsFile::verify(const std::string& key) const {
  const TensorInfo& entry = info(key);
  if (!entry.has_checksum) return;
  {
    std::lock_guard<std::mutex> lock(impl_->verified_mutex);
    if (impl_->verified.count(key)) return;
  }
  const uint64_t actual = hash_range(impl_->fd, impl_->data_start + entry.begin,
                                     entry.end - entry.begin, impl_->path, key);
  if (actual != entry.checksum) checksum_mismatch(impl_->path, entry, actual);
  std::lock_guard<std::mutex> lock(impl_->verified_mutex);
  impl_->verified.insert(key);
}

at::Tensor SafetensorsFile::load_flat(const std::string& key, int64_t begin, int64_t end) const {
  const TensorInfo& entry = info(key);
  const int64_t numel = entry.spec.numel();
  STRATA_CHECK(0 <= begin && begin <= end && end <= numel, CheckpointError, "[checkpoint] ",
               impl_->path, ": tensor '", key, "' has ", numel, " elements; elements [", begin,
               ", ", end, ") are out of range");
  // A part cannot be checked on its own: the whole tensor is, once.
  if (impl_->verify && entry.has_checksum && (begin != 0 || end != numel)) verify(key);
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(entry.spec.dtype));
  const uint64_t item = c10::elementSize(entry.spec.dtype);
  const uint64_t size = static_cast<uint64_t>(end - begin) * item;
  if (size == 0) return out;
  const uint64_t offset = impl_->data_start + entry.begin + static_cast<uint64_t>(begin) * item;
  const size_t got = pread_full(impl_->fd, out.data_ptr(), size, offset, impl_->path);
  STRATA_CHECK(got == size, CheckpointError, "[checkpoint] ", impl_->path, ": tensor '", key,
               "' elements [", begin, ", ", end, ") need ", size, " bytes but the file ended after ",
               got, " of them (truncated after it was opened?)");
  if (impl_->verify && entry.has_checksum && begin == 0 && end == numel) {
    const uint64_t actual = xxh64(out.data_ptr(), size);
    if (actual != entry.checksum) checksum_mismatch(impl_->path, entry, actual);
  }
  return out;
}

NamedTensors SafetensorsFile::load_all() const {
  NamedTensors out;
  out.reserve(impl_->keys.size());
  for (const auto& key : impl_->keys) out.emplace_back(key, load(key));
  return out;
}

const Metadata& SafetensorsFile::metadata() const { return impl_->metadata; }

const std::string& SafetensorsFile::path() const { return impl_->path; }

}  // namespace strata::checkpoint
