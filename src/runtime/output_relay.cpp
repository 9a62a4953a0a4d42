// The launcher's relay of its workers' output (output_relay.h).
#include "output_relay.h"

#include <unistd.h>

#include <cerrno>

#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::runtime::launch {

Worker& OutputRelay::owner(const Stream& s) {
  for (Worker& w : workers_)
    if (&w.out == &s || &w.err == &s) return w;
  STRATA_ASSERT(false, "stream without a worker");
}

bool OutputRelay::read_stream(Stream& s) {
  char buffer[16384];
  ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
  if (n < 0 && errno == EINTR) return true;
  if (n < 0 && errno == EAGAIN) return false;
  if (n <= 0) {
    close_stream(s);
    return false;
  }
  if (terminal_) {
    take_terminal_output(owner(s), s, buffer, static_cast<size_t>(n));
    return true;
  }
  s.partial.append(buffer, static_cast<size_t>(n));
  size_t begin = 0;
  while (true) {
    size_t nl = s.partial.find('\n', begin);
    if (nl == std::string::npos) break;
    emit(owner(s), s.kind, s.partial.substr(begin, nl - begin));
    begin = nl + 1;
  }
  s.partial.erase(0, begin);
  if (s.partial.size() > kMaxLine) {
    emit(owner(s), s.kind, s.partial);
    s.partial.clear();
  }
  return true;
}

void OutputRelay::close_stream(Stream& s) {
  if (terminal_) {
    s.pending_cr = false;
    if (!s.partial.empty() || open_ == &s) end_line(owner(s), s);
  } else if (!s.partial.empty()) {
    emit(owner(s), s.kind, s.partial);
  }
  s.partial.clear();
  ::close(s.fd);
  s.fd = -1;
}

std::string OutputRelay::prefix(const Worker& w) const {
  return options_.prefix_output ? detail::cat("[rank ", w.rank, "] ") : std::string();
}

void OutputRelay::write(const Worker& w, OutputStream kind, const std::string& text) {
  if (options_.on_output) {
    options_.on_output(w.rank, kind, text);
  } else {
    write_all(kind == OutputStream::kStdout ? STDOUT_FILENO : STDERR_FILENO, text);
  }
}

void OutputRelay::emit(Worker& w, OutputStream kind, std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (kind == OutputStream::kStderr) w.errors.add(line);  // Note [The last error line] in error_line.cpp
  end_redraw();
  write(w, kind, prefix(w) + line + "\n");
}

// Note [Redraws through the launcher]
// A progress bar on a terminal redraws one line in place: "\r" and the
// new text, no newline (trainer::ProgressBar; tqdm writes "text\r").
// Relayed line by line, a worker's redraws showed nothing until a
// newline, so a launched job printed a line every few steps instead. On a
// terminal the launcher keeps them: it splits a worker's output at '\r'
// as well as '\n'. Text after a '\r' is the line's new content; it is
// drawn as "\r[rank R] text\x1b[K" (clear to the end of the line) without
// a newline when another '\r' replaces it or a read ends inside it (the
// worker flushed), and once more with "\n" when a '\n' ends it. "\r\n"
// is a plain line end. One redraw is open on the terminal at a time: any
// other output (another line, another rank's redraw, the launcher's own
// words) first ends it with a newline, and the next redraw starts on a
// fresh line. Off a terminal nothing changes ('\r' is text, a trailing
// one is dropped): logs keep one line per line.
void OutputRelay::take_terminal_output(Worker& w, Stream& s, const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (s.pending_cr) {
      s.pending_cr = false;
      if (c == '\n') {
        end_line(w, s);
        continue;
      }
      carriage_return(w, s);
    }
    if (c == '\n') {
      end_line(w, s);
    } else if (c == '\r') {
      s.pending_cr = true;
    } else {
      s.partial += c;
      if (s.partial.size() > kMaxLine) end_line(w, s);
    }
  }
  // The worker flushed: show the line it is redrawing as it is now.
  if ((s.redraw || s.pending_cr) && !s.partial.empty() && s.shown != s.partial.size()) draw(w, s, false);
}

// A '\r' not followed by '\n': what the line held is replaced.
void OutputRelay::carriage_return(Worker& w, Stream& s) {
  if (!s.partial.empty() && s.shown != s.partial.size()) draw(w, s, false);
  s.partial.clear();
  s.shown = 0;
  s.redraw = true;
}

// A '\n' (or the end of the stream): the line is done.
void OutputRelay::end_line(Worker& w, Stream& s) {
  if (s.redraw || s.shown > 0) {
    if (!s.partial.empty()) draw(w, s, true);
    else if (open_ == &s) end_redraw();
  } else {
    emit(w, s.kind, s.partial);
  }
  s.partial.clear();
  s.shown = 0;
  s.redraw = false;
}

void OutputRelay::draw(Worker& w, Stream& s, bool final_draw) {
  std::string text = s.partial;
  static const std::string kClear = "\x1b[K";
  while (text.size() >= kClear.size() && text.compare(text.size() - kClear.size(), kClear.size(), kClear) == 0)
    text.resize(text.size() - kClear.size());
  if (open_ != nullptr && open_ != &s) end_redraw();
  if (final_draw && s.kind == OutputStream::kStderr) w.errors.add(text);
  write(w, s.kind, "\r" + prefix(w) + text + kClear + (final_draw ? "\n" : ""));
  open_ = final_draw ? nullptr : &s;
  s.shown = final_draw ? 0 : s.partial.size();
}

void OutputRelay::end_redraw() {
  if (open_ == nullptr) return;
  Stream* s = open_;
  open_ = nullptr;
  write(owner(*s), s->kind, "\n");
}

}  // namespace strata::runtime::launch
