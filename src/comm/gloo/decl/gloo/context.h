// strata's declarations of the Gloo names that c10d's ProcessGroupGloo.hpp
// mentions, for LibTorch builds (the torch wheels) that ship c10d's headers
// without Gloo's. Only src/comm/gloo/process_group_gloo.cpp sees them; it
// constructs c10d::ProcessGroupGloo and hands it out as a c10d::Backend.
// strata never creates, calls or destroys a Gloo object itself: the header
// holds each of these types by pointer, so c10d's class layout is the same
// as with Gloo's own headers, and all Gloo code that runs is the copy
// inside libtorch_cpu.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

/// A group's connections (used by the header only through a pointer and
/// one inline call, setTimeout).
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {

/// The rendezvous interface c10d's GlooStore implements.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace rendezvous
}  // namespace gloo
