// The per-process progress record and the heartbeat thread.
//
// Note [Heartbeats]
// strata's launcher gives every worker one end of a pipe (its number in
// STRATA_HEARTBEAT_FD) and an interval (STRATA_HEARTBEAT_MS). The first
// progress report starts a detached thread that writes the record as one
// short line every interval. A line is under PIPE_BUF, so it arrives whole,
// and the write end is non-blocking, so a launcher that stops reading
// never blocks a worker. The launcher tells "stopped or frozen" (no
// heartbeat) from "alive but not moving" (heartbeats, no new events) and
// from "waiting in a collective" (in_collective).
#include "strata/runtime/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

namespace strata::runtime {
namespace {

struct Record {
  std::mutex mu;
  Heartbeat now;
};

// Never destroyed: the heartbeat thread may outlive static destructors.
Record& record() {
  static Record* r = new Record;
  return *r;
}

void heartbeat_loop(int fd, int interval_ms) {
  for (;;) {
    std::string line;
    {
      std::lock_guard<std::mutex> lock(record().mu);
      line = record().now.to_line();
    }
    ssize_t ignored = ::write(fd, line.data(), line.size());
    (void)ignored;
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
}

void start_heartbeat_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* fd_text = std::getenv(kEnvHeartbeatFd);
    if (fd_text == nullptr) return;
    char* end = nullptr;
    long fd = std::strtol(fd_text, &end, 10);
    if (end == fd_text || *end != '\0' || fd < 0 || ::fcntl(static_cast<int>(fd), F_GETFD) < 0) return;
    long ms = 1000;
    if (const char* ms_text = std::getenv(kEnvHeartbeatMs)) {
      long v = std::strtol(ms_text, &end, 10);
      if (end != ms_text && *end == '\0' && v >= 10 && v <= 3600 * 1000) ms = v;
    }
    ::fcntl(static_cast<int>(fd), F_SETFL, ::fcntl(static_cast<int>(fd), F_GETFL) | O_NONBLOCK);
    std::thread(heartbeat_loop, static_cast<int>(fd), static_cast<int>(ms)).detach();
  });
}

// Labels travel on one line: no newlines, bounded length.
std::string clean(const std::string& label) {
  std::string out = label.substr(0, 200);
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

}  // namespace

void report_step(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(record().mu);
    if (record().now.step == step) return;
    record().now.step = step;
    ++record().now.events;
  }
  start_heartbeat_once();  // after the update: the first heartbeat carries it
}

CollectiveScope::CollectiveScope(const std::string& label) {
  start_heartbeat_once();
  std::lock_guard<std::mutex> lock(record().mu);
  record().now.in_collective = true;
  record().now.label = clean(label);
  ++record().now.events;
}

CollectiveScope::~CollectiveScope() {
  std::lock_guard<std::mutex> lock(record().mu);
  record().now.in_collective = false;
  ++record().now.events;
}

std::string Heartbeat::to_line() const {
  std::ostringstream out;
  out << "strata-heartbeat " << events << " " << step << " " << (in_collective ? 1 : 0) << " " << label << "\n";
  return out.str();
}

bool Heartbeat::parse(const std::string& line, Heartbeat& out) {
  std::istringstream in(line);
  std::string tag;
  int in_op = 0;
  if (!(in >> tag >> out.events >> out.step >> in_op) || tag != "strata-heartbeat") return false;
  out.in_collective = in_op != 0;
  in.get();  // the space before the label
  std::getline(in, out.label);
  return true;
}

}  // namespace strata::runtime
