// TensorBoard event files: CRC-32C, TFRecord framing, and the hand-written
// protobuf encoding of the two kinds of Event strata writes.
//
// Field numbers (tensorflow/core/util/event.proto and
// tensorflow/core/framework/summary.proto):
//   Event:         wall_time = 1 (double), step = 2 (int64),
//                  file_version = 3 (string), summary = 5 (Summary)
//   Summary:       value = 1 (repeated Value)
//   Summary.Value: tag = 1 (string), simple_value = 2 (float)
//   Summary.Value: metadata = 9 (SummaryMetadata)
//   SummaryMetadata: plugin_data = 1 (PluginData: plugin_name = 1, content = 2)
// and for the hparams plugin (tensorboard/plugins/hparams/*.proto):
//   HParamsPluginData: version = 1, experiment = 2, session_start_info = 3,
//                     session_end_info = 4
//   SessionStartInfo: hparams = 1 (map<string, google.protobuf.Value>,
//                     entries with key = 1, value = 2), start_time_secs = 5
//   google.protobuf.Value: number_value = 2, string_value = 3, bool_value = 4
// Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
#include "strata/loggers/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "strata/core/error.h"

namespace strata::trainer {
namespace {

// Byte-at-a-time table for the reflected Castagnoli polynomial.
constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, int field, double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, 1);
  put_le(out, bits, 8);
}

void put_float(std::string& out, int field, float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, 5);
  put_le(out, bits, 4);
}

// Event fields 1 and 2, common to every event.
std::string event_header(double wall_time, std::int64_t step) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {
    put_key(event, 2, 0);
    put_varint(event, static_cast<std::uint64_t>(step));  // int64: two's complement, as protobuf does
  }
  return event;
}

std::atomic<int> g_file_counter{0};

}  // namespace

// Code points past U+10FFFF are invalid too.
std::size_t utf8_sequence_length(const std::string& s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n;
  std::uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (byte(i + k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

namespace {

std::string printable(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return s.size() > 80 ? out + "..." : out;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tf_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string encode_file_version_event(double wall_time, const std::string& file_version) {
  std::string event = event_header(wall_time, 0);
  put_bytes(event, 3, file_version);
  return event;
}

std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, 1, tag);
    put_float(entry, 2, static_cast<float>(value));
    put_bytes(summary, 1, entry);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

namespace {

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD
// (protobuf readers refuse strings that are not UTF-8).
std::string valid_utf8(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

namespace {

// One Event at step 0 holding one hparams-plugin summary `tag` whose
// content is the HParamsPluginData field `field` set to `message`.
std::string hparams_plugin_event(double wall_time, const char* tag, int field, const std::string& message) {
  std::string plugin_data;  // HParamsPluginData; version 0 is the default, not written
  put_bytes(plugin_data, field, message);
  std::string plugin;
  put_bytes(plugin, 1, "hparams");
  put_bytes(plugin, 2, plugin_data);
  std::string metadata;
  put_bytes(metadata, 1, plugin);
  std::string entry;
  put_bytes(entry, 1, tag);
  put_bytes(entry, 9, metadata);
  std::string summary;
  put_bytes(summary, 1, entry);
  std::string event = event_header(wall_time, 0);
  put_bytes(event, 5, summary);
  return event;
}

}  // namespace

std::vector<std::string> encode_hparams_events(double wall_time, const std::vector<HparamValue>& hparams,
                                               const std::vector<std::string>& metric_tags) {
  // Experiment: hparam_infos = 4 (HParamInfo: name = 1, type = 4 with
  // DATA_TYPE_STRING 1, BOOL 2, FLOAT64 3), metric_infos = 5 (MetricInfo:
  // name = 1, a MetricName with tag = 2).
  std::string experiment;
  for (const HparamValue& h : hparams) {
    std::string info;
    put_bytes(info, 1, valid_utf8(h.name));
    put_key(info, 4, 0);
    put_varint(info, h.kind == HparamValue::Kind::kText ? 1 : h.kind == HparamValue::Kind::kBool ? 2 : 3);
    put_bytes(experiment, 4, info);
  }
  for (const std::string& tag : metric_tags) {
    std::string name;
    put_bytes(name, 2, valid_utf8(tag));
    std::string info;
    put_bytes(info, 1, name);
    put_bytes(experiment, 5, info);
  }
  std::string start_info;
  for (const HparamValue& h : hparams) {
    std::string value;
    switch (h.kind) {
      case HparamValue::Kind::kNumber: put_double(value, 2, h.number); break;
      case HparamValue::Kind::kBool:
        put_key(value, 4, 0);
        put_varint(value, h.flag ? 1 : 0);
        break;
      case HparamValue::Kind::kText: put_bytes(value, 3, valid_utf8(h.text)); break;
    }
    std::string entry;
    put_bytes(entry, 1, valid_utf8(h.name));
    put_bytes(entry, 2, value);
    put_bytes(start_info, 1, entry);
  }
  put_double(start_info, 5, wall_time);
  std::string end_info;  // SessionEndInfo: status = 1 (STATUS_SUCCESS = 1), as torch's hparams() writes it
  put_key(end_info, 1, 0);
  put_varint(end_info, 1);
  return {hparams_plugin_event(wall_time, "_hparams_/experiment", 2, experiment),
          hparams_plugin_event(wall_time, "_hparams_/session_start_info", 3, start_info),
          hparams_plugin_event(wall_time, "_hparams_/session_end_info", 4, end_info)};
}

void check_tag(const std::string& tag) {
  STRATA_CHECK(!tag.empty(), ConfigError, "[tensorboard] a metric name is empty; give every logged value a name");
  STRATA_CHECK(tag.size() <= kMaxTagBytes, ConfigError, "[tensorboard] metric name '", printable(tag), "' is ",
               tag.size(), " bytes long; the limit is ", kMaxTagBytes, " bytes");
  for (std::size_t i = 0; i < tag.size();) {
    const std::size_t n = utf8_sequence_length(tag, i);
    STRATA_CHECK(n != 0, ConfigError, "[tensorboard] metric name '", printable(tag),
                 "' is not valid UTF-8 (byte ", i, "); TensorBoard needs UTF-8 names");
    const unsigned char c = static_cast<unsigned char>(tag[i]);
    STRATA_CHECK(n > 1 || (c >= 0x20 && c != 0x7F), ConfigError, "[tensorboard] metric name '", printable(tag),
                 "' holds a control character (byte ", i, "); use printable names");
    i += n;
  }
}

std::string sanitize_host(const std::string& host) {
  std::string out;
  for (char c : host) {
    if (out.size() == 64) break;
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '_';
    out.push_back(safe ? c : '_');
  }
  if (out.empty()) return "localhost";
  if (out[0] == '.') out[0] = '_';
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const double wall_time = std::chrono::duration<double>(now).count();
  char name[192];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d",
                static_cast<long long>(wall_time), sanitize_host(host).c_str(), static_cast<int>(::getpid()),
                g_file_counter.fetch_add(1));
  path_ = dir + "/" + name;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  STRATA_CHECK_SYSCALL(fd_, Error, "[tensorboard] cannot create event file ", path_);
  append_event(encode_file_version_event(wall_time, "brain.Event:2"));
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (...) {
    // A destructor cannot report; finalize() is where errors surface.
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
}

void EventFileWriter::append_event(const std::string& event) {
  STRATA_CHECK(fd_ >= 0, Error, "[tensorboard] event file ", path_, " is closed");
  buffer_ += tf_record(event);
  if (buffer_.size() >= (1u << 20)) flush();
}

void EventFileWriter::flush() {
  if (fd_ < 0 || buffer_.empty()) return;
  // Note [Whole records]: one write(2) of whole records. On a regular file
  // Linux writes all of it unless the disk is full or the file too large;
  // a short write is then an error, and the partial tail is cut off again
  // so the file still ends at a record boundary.
  const off_t start = ::lseek(fd_, 0, SEEK_END);
  ssize_t n;
  do {
    n = ::write(fd_, buffer_.data(), buffer_.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(buffer_.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    if (start >= 0 && n > 0 && ::ftruncate(fd_, start) != 0) {
      // Nothing more to do: the reader stops at a truncated final record.
    }
    buffer_.clear();
    throw Error(detail::cat("[tensorboard] writing event file ", path_, " failed: ", detail::errno_string(err),
                            "; free space on that disk or log elsewhere"));
  }
  buffer_.clear();
}

void EventFileWriter::close() {
  if (fd_ < 0) return;
  flush();
  const int fd = fd_;
  fd_ = -1;
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(synced == 0, Error, "[tensorboard] fsync of event file ", path_,
               " failed: ", detail::errno_string(err));
}

}  // namespace strata::trainer
