// Reading checkpoint input that may be hostile: a checkpoint is a folder a
// user may have downloaded, copied from a shared disk, or had tampered with,
// so nothing read from it is trusted.
//
// - JSON (safetensors headers, metadata.json) is parsed with limits on size,
//   nesting depth and the number of values and numbers, and with no key
//   repeated inside an object, so a document can neither overflow the stack
//   nor exhaust memory nor hide a second value behind a first.
// - Only regular files are opened, never through a symbolic link (O_NOFOLLOW)
//   and never a FIFO or a device (O_NONBLOCK, then fstat), so opening cannot
//   hang and cannot read outside the checkpoint folder.
// - File names a checkpoint lists are plain names inside its folder.
// - Counters (steps, epochs, positions) are integers in [0, 2^53).
// Every failure is a CheckpointError "[checkpoint] <file>: <field>: ...".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace strata::checkpoint {

/// Limits on one JSON document read from a checkpoint.
struct JsonLimits {
  uint64_t max_bytes = 64ull << 20;   ///< size of the text
  int max_depth = 64;                 ///< nesting of arrays and objects
  uint64_t max_values = 8'000'000;    ///< every value, containers included
  uint64_t max_numbers = 4'000'000;   ///< numbers among them
};

/// The limits for metadata.json (64 MiB, depth 64).
JsonLimits metadata_json_limits();
/// The limits for a safetensors header (100 MB, the reference reader's
/// limit; depth 64).
JsonLimits header_json_limits();

/// Parses `text` within `limits`. Throws CheckpointError "[checkpoint]
/// <where>: <what> ..." when the text is not JSON ("is not valid JSON"),
/// exceeds a limit (naming it) or repeats a key inside an object ("names
/// 'k' twice in one object"). `where` is the file, `what` the document
/// ("the header", "metadata.json").
nlohmann::json parse_json_limited(const std::string& text, const JsonLimits& limits,
                                  const std::string& where, const std::string& what);

/// Opens `path` for reading if it is a regular file, never following a
/// symbolic link in its last component and never blocking (a FIFO is
/// refused, not waited on). Returns the descriptor (O_CLOEXEC). Throws
/// CheckpointError naming the path: "is a symbolic link", "is not a regular
/// file (a FIFO)", "does not exist", or the errno text.
int open_regular_file(const std::string& path);

/// Reads the whole regular file `path` (open_regular_file), refusing one
/// larger than `max_bytes`.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

/// Checks that `name`, a file name a checkpoint lists (field `field` of
/// `where`), is a plain name inside the checkpoint folder: not empty, no
/// '/', no NUL, not "." or "..". Throws CheckpointError otherwise.
void check_contained_name(const std::string& name, const std::string& where,
                          const std::string& field);

/// The largest counter (step, epoch, position) a checkpoint may hold: 2^53-1,
/// the largest integer every JSON reader holds exactly.
inline constexpr int64_t kMaxCounter = (int64_t(1) << 53) - 1;

/// `value` as a counter: an integer in [0, kMaxCounter]. Throws
/// CheckpointError "[checkpoint] <where>: <field> is <value>; expected an
/// integer from 0 to 9007199254740991" otherwise (floats such as 1.5 or
/// 1e30 included).
int64_t checked_counter(const nlohmann::json& value, const std::string& where,
                        const std::string& field);

/// Reports a problem a non-strict load tolerates ("[checkpoint] warning:
/// ..." on stderr, or the handler set below). Never throws.
void warn(const std::string& message);

/// Replaces where warnings go (tests collect them); an empty function
/// restores stderr. Returns the previous handler.
using WarningHandler = void (*)(const std::string&);
WarningHandler set_warning_handler(WarningHandler handler);

}  // namespace strata::checkpoint
