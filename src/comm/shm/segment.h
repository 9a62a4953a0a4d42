// The shared segment of one shm group and its synchronisation: layout,
// creation and mapping, per-rank phase counters, waiting with a deadline,
// peer liveness, and the abort flag that turns one rank's failure into a
// CommError on every other rank.
//
// Layout (every part on its own cache lines):
//   Header        magic, version, size, slot bytes, abort state and reason
//   RankState[N]  per rank: pid, phase counter (a futex word), sleepers
//   data          2 buffers x N ranks x slot_bytes (staging slots)
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::comm::shm::detail {

constexpr uint32_t kMagic = 0x53544d31;  // "STM1"
constexpr uint32_t kVersion = 1;
constexpr int kMaxRanks = 256;
constexpr size_t kLine = 128;  // two cache lines: the adjacent-line prefetcher

struct alignas(kLine) Header {
  uint32_t magic;
  uint32_t version;
  int32_t size;
  int32_t pad;
  int64_t slot_bytes;
  std::atomic<uint32_t> aborted;  // 0, or 1 + the rank that aborted
  std::atomic<uint32_t> reason_ready;
  char reason[512];
};

struct alignas(kLine) RankState {
  std::atomic<uint32_t> phase;    // phases this rank completed (wraps)
  std::atomic<uint32_t> sleepers;  // ranks asleep on `phase`
  std::atomic<int32_t> pid;
};

/// One mapped segment. Not copyable; unmaps on destruction.
class Segment {
 public:
  /// Creates (rank 0) the named segment; throws CommError saying why not.
  static Segment create(const std::string& name, int size, int64_t slot_bytes);
  /// Opens and maps an existing one; throws CommError saying why not.
  static Segment open(const std::string& name, int size, int64_t slot_bytes);
  /// Removes the name (the mapping stays valid); false when it was gone.
  static bool unlink(const std::string& name);

  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  static size_t bytes_for(int size, int64_t slot_bytes);

  Header& header() const { return *static_cast<Header*>(base_); }
  RankState& state(int r) const { return reinterpret_cast<RankState*>(static_cast<char*>(base_) + sizeof(Header))[r]; }
  /// Rank r's staging slot in buffer b (0 or 1).
  char* slot(int b, int r) const { return data_ + (static_cast<size_t>(b) * size_ + r) * slot_bytes_; }
  int64_t slot_bytes() const { return slot_bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  char* data_ = nullptr;
  int size_ = 0;
  int64_t slot_bytes_ = 0;
};

/// What a failed wait says about the group; the backend builds the message.
struct WaitFailure {
  enum class Kind { kNone, kTimeout, kPeerExited, kAborted } kind = Kind::kNone;
  std::vector<int> peers;  // the peers still missing (timeout) or gone
  std::string reason;      // kAborted: what the aborting rank said
  int aborted_by = -1;
};

/// This rank's view of the group's synchronisation (Note [Phases]).
class Sync {
 public:
  Sync(const Segment* segment, int rank, int size, int spin_us);
  ~Sync();

  /// Marks phase `p` done by this rank and wakes sleepers.
  void publish(uint32_t p);
  /// Waits until every rank in [0, size) (or only `only` when >= 0) reached
  /// phase `p`, or until `deadline`; returns kNone on success.
  WaitFailure wait_all(uint32_t p, std::chrono::steady_clock::time_point deadline, int only = -1);
  /// Records the first failure in the segment and wakes everyone, so peers
  /// waiting on this rank fail at once instead of at their timeout.
  void abort(const std::string& reason);
  /// The pids of the peers (filled at setup).
  void watch_peers();

 private:
  bool reached(int q, uint32_t p) const;
  bool peer_exited(int q);
  void sleep_on(int q, uint32_t seen, std::chrono::steady_clock::time_point deadline);

  const Segment* seg_;
  int rank_, size_;
  std::chrono::nanoseconds spin_;
  std::vector<int> pidfds_;  // -1 where pidfd_open is unavailable: kill(pid, 0)
  std::vector<int> pids_;
};

/// Reached: phases wrap at 2^32; compare by signed distance.
inline bool phase_at_least(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

}  // namespace strata::comm::shm::detail
