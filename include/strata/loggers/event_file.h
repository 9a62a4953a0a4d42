// TensorBoard event files, written without TensorFlow or protobuf.
//
// An event file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// (little-endian), where each `data` is one serialized `tensorflow.Event`
// protobuf. The first record holds the event with file_version
// "brain.Event:2"; the others hold a Summary of scalar values
// (`Summary.Value.simple_value`). The encoding of those few messages is
// written by hand here (src/loggers/event_file.cpp lists the field numbers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::trainer {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes,
/// continuing from `crc` (0 to start). crc32c("123456789") == 0xE3069283.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

/// The masked CRC TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xA282EAD8.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

/// `data` framed as one TFRecord (length, its masked CRC, data, its masked CRC).
std::string tf_record(const std::string& data);

/// A serialized Event holding `file_version` (the first event of a file).
std::string encode_file_version_event(double wall_time, const std::string& file_version);

/// A serialized Event at `step` holding one Summary with a `simple_value`
/// (a float, as TensorBoard stores scalars) for each (tag, value).
std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars);

/// One hyperparameter as TensorBoard's HPARAMS tab shows it.
struct HparamValue {
  enum class Kind { kNumber, kBool, kText };
  std::string name;
  Kind kind = Kind::kText;
  double number = 0;
  bool flag = false;
  std::string text;
};

/// The three serialized Events (at step 0) that torch's
/// SummaryWriter writes for Lightning's TensorBoardLogger.log_hyperparams:
/// the hparams plugin's experiment (tag "_hparams_/experiment": each
/// hyperparameter's name and type, each of `metric_tags` as a metric),
/// session_start_info (the values) and session_end_info (STATUS_SUCCESS).
/// Names and texts that are not valid UTF-8 have the bad bytes replaced by
/// U+FFFD.
std::vector<std::string> encode_hparams_events(double wall_time, const std::vector<HparamValue>& hparams,
                                               const std::vector<std::string>& metric_tags);

/// Checks that `tag` can name a scalar: 1 to kMaxTagBytes bytes of valid
/// UTF-8 with no control character. Throws ConfigError "[tensorboard]
/// metric name ... " saying which rule it breaks.
void check_tag(const std::string& tag);

/// Length of the UTF-8 sequence that starts at byte `i` of `s`, or 0 when
/// it is not valid UTF-8 (overlong forms and surrogates included).
std::size_t utf8_sequence_length(const std::string& s, std::size_t i);

/// Longest metric name accepted, in bytes.
inline constexpr std::size_t kMaxTagBytes = 1024;

/// `host` reduced to characters safe in a file name ([A-Za-z0-9._-], others
/// become '_'), at most 64 of them, never empty and never starting with '.'.
std::string sanitize_host(const std::string& host);

/// One event file, appended record by record. Records are buffered in
/// memory and reach the file whole: each flush() is one write(2) of whole
/// records, so a crash leaves no partial record behind (short of the disk
/// itself failing mid-write, which TensorBoard's reader tolerates at the
/// end of a file).
class EventFileWriter {
 public:
  /// Creates `dir/events.out.tfevents.<seconds>.<host>.<pid>.<n>` (dir must
  /// exist; the name is new, O_EXCL) and writes its file_version record.
  /// Throws Error naming the path when the file cannot be created.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Buffers one Event record; writes the buffer out when it passes 1 MiB.
  void append_event(const std::string& event);
  /// Writes every buffered record to the file (one write(2)). Throws Error
  /// naming the file and the errno text ("No space left on device").
  void flush();
  /// Flushes, fsyncs and closes; later calls do nothing.
  void close();

  /// The file's path.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string buffer_;
  int fd_ = -1;
};

}  // namespace strata::trainer
