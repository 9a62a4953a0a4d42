// How the launcher relays its workers' output (supervisor.cpp): each
// worker's stdout and stderr read as they come, split into lines, each
// line written with its rank's prefix (or handed to
// LaunchOptions::on_output), the last error lines kept for the report, and
// on a terminal a worker's progress line redrawn in place (Note [Redraws
// through the launcher] in output_relay.cpp).
#pragma once

#include <string>
#include <vector>

#include "launch_internal.h"

namespace strata::runtime::launch {

class OutputRelay {
 public:
  OutputRelay(const LaunchOptions& options, std::vector<Worker>& workers, bool terminal)
      : options_(options), workers_(workers), terminal_(terminal) {}

  /// Reads what `s` has; false when nothing was there (or at its end,
  /// which closes it).
  bool read_stream(Stream& s);
  /// Writes out what `s` holds of a line, and closes it.
  void close_stream(Stream& s);
  /// Ends the open redraw, if any, with a newline.
  void end_redraw();

 private:
  Worker& owner(const Stream& s);
  std::string prefix(const Worker& w) const;
  void write(const Worker& w, OutputStream kind, const std::string& text);
  void emit(Worker& w, OutputStream kind, std::string line);
  void take_terminal_output(Worker& w, Stream& s, const char* data, size_t n);
  void carriage_return(Worker& w, Stream& s);
  void end_line(Worker& w, Stream& s);
  void draw(Worker& w, Stream& s, bool final_draw);

  const LaunchOptions& options_;
  std::vector<Worker>& workers_;
  bool terminal_;
  Stream* open_ = nullptr;  // the stream whose redraw is open (Note [Redraws through the launcher])
};

}  // namespace strata::runtime::launch
