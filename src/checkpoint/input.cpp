// Reading checkpoint input that may be hostile (include/strata/checkpoint/input.h).
#include "strata/checkpoint/input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <set>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/log.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::atomic<WarningHandler> g_warning_handler{nullptr};

}  // namespace

JsonLimits metadata_json_limits() { return JsonLimits{}; }

JsonLimits header_json_limits() {
  JsonLimits limits;
  limits.max_bytes = 100'000'000;
  return limits;
}

// Note [Parsing JSON from a checkpoint]
// nlohmann's parser is iterative, but copying, comparing or printing a
// document recurses once per level, so a million nested brackets overflow
// the stack later, far from the parse. The callback below sees every event
// while the document is built and stops the parse (by throwing) as soon as
// a limit is passed, so a hostile document never exists in memory beyond
// the limits. It also refuses a key repeated inside one object, which
// nlohmann would silently resolve to the last value.
nlohmann::json parse_json_limited(const std::string& text, const JsonLimits& limits,
                                  const std::string& where, const std::string& what) {
  STRATA_CHECK(text.size() <= limits.max_bytes, CheckpointError, "[checkpoint] ", where, ": ",
               what, " is ", text.size(), " bytes, more than the limit of ", limits.max_bytes,
               " bytes");
  uint64_t values = 0, numbers = 0;
  std::vector<std::set<std::string>> keys;  // one set per open object
  using Event = nlohmann::json::parse_event_t;
  auto callback = [&](int depth, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        STRATA_CHECK(depth < limits.max_depth, CheckpointError, "[checkpoint] ", where,
                     ": ", what, " is nested deeper than the limit of ", limits.max_depth,
                     " levels");
        ++values;
        if (event == Event::object_start) keys.emplace_back();
        break;
      case Event::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Event::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get_ref<const std::string&>()).second)
          throw CheckpointError(cat("[checkpoint] ", where, ": ", what, " names '",
                                    parsed.get_ref<const std::string&>(),
                                    "' twice in one object"));
        break;
      case Event::value:
        ++values;
        if (parsed.is_number()) ++numbers;
        break;
      case Event::array_end:
        break;
    }
    STRATA_CHECK(values <= limits.max_values, CheckpointError, "[checkpoint] ", where,
                 ": ", what, " holds more than the limit of ", limits.max_values,
                 " values");
    STRATA_CHECK(numbers <= limits.max_numbers, CheckpointError, "[checkpoint] ", where,
                 ": ", what, " holds more than the limit of ", limits.max_numbers,
                 " numbers");
    return true;
  };
  try {
    return nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(cat("[checkpoint] ", where, ": ", what, " is not valid JSON (", e.what(), ")"));
  }
}

int open_regular_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
  // writer; a regular file ignores it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd == -1) {
    const int err = errno;
    struct stat st {};
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      throw CheckpointError(cat("[checkpoint] ", path,
                                ": is a symbolic link; checkpoint files must be regular files "
                                "inside the checkpoint folder"));
    throw CheckpointError(cat("[checkpoint] ", path, ": cannot open: ",
                              ::strata::detail::errno_string(err),
                              err == ENOENT ? "; the file does not exist" : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw CheckpointError(cat("[checkpoint] ", path, ": is ", file_kind(mode),
                              ", not a regular file; checkpoint files must be regular files"));
  }
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  const int fd = open_regular_file(path);
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw CheckpointError(cat("[checkpoint] ", path, ": ", st.st_size,
                              " bytes exceed the limit of ", max_bytes, " bytes"));
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  // Read up to the limit only: a file that grows while read stays bounded.
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) {
      const int err = errno;
      ::close(fd);
      throw CheckpointError(cat("[checkpoint] ", path, ": read failed: ",
                                ::strata::detail::errno_string(err)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

void check_contained_name(const std::string& name, const std::string& where,
                          const std::string& field) {
  STRATA_CHECK(!name.empty() && name.find('/') == std::string::npos &&
                   name.find('\0') == std::string::npos && name != "." && name != "..",
               CheckpointError, "[checkpoint] ", where, ": ", field, " names '", name,
               "', which is not a plain file name inside the checkpoint folder (no '/', not '.' "
               "or '..')");
}

int64_t checked_counter(const nlohmann::json& value, const std::string& where,
                        const std::string& field) {
  bool ok = false;
  if (value.is_number_unsigned()) ok = value.get<uint64_t>() <= uint64_t(kMaxCounter);
  else if (value.is_number_integer()) ok = value.get<int64_t>() >= 0 && value.get<int64_t>() <= kMaxCounter;
  STRATA_CHECK(ok, CheckpointError, "[checkpoint] ", where, ": ", field, " is ", value.dump(),
               "; expected an integer from 0 to ", kMaxCounter);
  return value.get<int64_t>();
}

void warn(const std::string& message) {
  try {
    if (WarningHandler handler = g_warning_handler.load()) {
      handler(message);
      return;
    }
    log::warning_all_ranks("[checkpoint] ", message);
  } catch (...) {
  }
}

WarningHandler set_warning_handler(WarningHandler handler) {
  return g_warning_handler.exchange(handler);
}

}  // namespace strata::checkpoint
