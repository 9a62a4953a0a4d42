// The shm group's segment and synchronisation (segment.h).
//
// Note [Phases]
// Every collective is a fixed sequence of phases that every rank goes
// through in the same order, so phase numbers agree across ranks without
// any exchange. A rank that finished phase p stores p in its own counter
// (one writer per counter, no locks); a rank that needs peers' data from
// phase p waits until their counters reach p. Counters only grow (modulo
// 2^32, compared by signed distance), so a fast peer that already moved
// on still satisfies "at least p".
//
// Note [Waiting for peers]
// On a machine with as many busy processes as cores, a spinning waiter
// takes the core the peer it waits for needs. So a waiter polls only
// briefly (spin_us: 5 us when the group has fewer ranks than there are
// cores, none otherwise: on 2 cores with 2 ranks under load, 20 us of
// polling made a 1 KB all-reduce 3-25x slower than yielding at once),
// then yields a few times (a yield hands the core to the peer when it is
// waiting for one), then sleeps on the peer's counter
// with a futex (the peer wakes it only when someone sleeps: the sleepers
// count, Dekker-style with sequentially consistent accesses). Sleeps are
// sliced (at most 50 ms) to check the deadline, the abort flag and whether
// the awaited peer still exists.
#include "segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <thread>

#include "strata/core/error.h"

namespace strata::comm::shm::detail {
namespace {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string shm_advice() {
  return "check that /dev/shm is mounted and has room (df -h /dev/shm), lower STRATA_SHM_SLOT_BYTES, "
         "or set STRATA_COMM_BACKEND=gloo";
}

}  // namespace

size_t Segment::bytes_for(int size, int64_t slot_bytes) {
  return round_up(sizeof(Header) + sizeof(RankState) * size, 4096) + 2 * static_cast<size_t>(size) * slot_bytes;
}

Segment Segment::create(const std::string& name, int size, int64_t slot_bytes) {
  const size_t bytes = bytes_for(size, slot_bytes);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  STRATA_CHECK(fd >= 0, CommError, "[shm] cannot create shared memory segment ", name, ": ",
               strata::detail::errno_string(errno), "; ", shm_advice());
  // Reserve the pages now: a tmpfs that runs out later would kill the
  // process with SIGBUS on first touch instead of failing here.
  int err = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : errno;
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw CommError(strata::detail::cat("[shm] cannot reserve ", bytes >> 20, " MiB of shared memory for ", size,
                                        " ranks (", name, "): ", strata::detail::errno_string(err), "; ", shm_advice()));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw CommError(strata::detail::cat("[shm] cannot map ", name, ": ", strata::detail::errno_string(err), "; ", shm_advice()));
  }
  Segment s;
  s.base_ = base;
  s.bytes_ = bytes;
  s.size_ = size;
  s.slot_bytes_ = slot_bytes;
  s.data_ = static_cast<char*>(base) + round_up(sizeof(Header) + sizeof(RankState) * size, 4096);
  Header* h = new (base) Header();
  h->size = size;
  h->slot_bytes = slot_bytes;
  h->aborted.store(0);
  h->reason_ready.store(0);
  for (int r = 0; r < size; ++r) {
    RankState* st = new (&s.state(r)) RankState();
    st->phase.store(0);
    st->sleepers.store(0);
    st->pid.store(0);
  }
  h->version = kVersion;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;  // last: openers check it
  return s;
}

Segment Segment::open(const std::string& name, int size, int64_t slot_bytes) {
  const size_t bytes = bytes_for(size, slot_bytes);
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  STRATA_CHECK(fd >= 0, CommError, "[shm] cannot open shared memory segment ", name, ": ",
               strata::detail::errno_string(errno),
               "; the ranks that share a host identity cannot share memory (different containers?): set "
               "STRATA_COMM_BACKEND=gloo, or give each its own STRATA_HOST_ID");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw CommError(strata::detail::cat("[shm] shared memory segment ", name, " has ", st.st_size,
                                        " bytes, expected ", bytes, " (is another program using this name?)"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(base != MAP_FAILED, CommError, "[shm] cannot map ", name, ": ", strata::detail::errno_string(err), "; ",
               shm_advice());
  Segment s;
  s.base_ = base;
  s.bytes_ = bytes;
  s.size_ = size;
  s.slot_bytes_ = slot_bytes;
  s.data_ = static_cast<char*>(base) + round_up(sizeof(Header) + sizeof(RankState) * size, 4096);
  const Header& h = s.header();
  std::atomic_thread_fence(std::memory_order_acquire);
  STRATA_CHECK(h.magic == kMagic && h.version == kVersion && h.size == size && h.slot_bytes == slot_bytes, CommError,
               "[shm] shared memory segment ", name, " does not match this group (size ", h.size, " slot ",
               h.slot_bytes, ", expected ", size, " and ", slot_bytes, "); every rank must use the same strata "
               "build and STRATA_SHM_SLOT_BYTES");
  return s;
}

bool Segment::unlink(const std::string& name) { return ::shm_unlink(name.c_str()) == 0; }

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    data_ = o.data_;
    size_ = o.size_;
    slot_bytes_ = o.slot_bytes_;
    o.base_ = nullptr;
    o.data_ = nullptr;
  }
  return *this;
}

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

// ---- Sync -------------------------------------------------------------------

Sync::Sync(const Segment* segment, int rank, int size, int spin_us)
    : seg_(segment), rank_(rank), size_(size), spin_(std::chrono::microseconds(spin_us)),
      pidfds_(size, -1), pids_(size, 0) {}

Sync::~Sync() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

void Sync::watch_peers() {
  for (int q = 0; q < size_; ++q) {
    pids_[q] = seg_->state(q).pid.load();
    if (q == rank_ || pids_[q] <= 0) continue;
#ifdef SYS_pidfd_open
    pidfds_[q] = static_cast<int>(::syscall(SYS_pidfd_open, pids_[q], 0));
#endif
  }
}

void Sync::publish(uint32_t p) {
  RankState& me = seg_->state(rank_);
  me.phase.store(p, std::memory_order_seq_cst);
  if (me.sleepers.load(std::memory_order_seq_cst) != 0) futex(&me.phase, FUTEX_WAKE, INT_MAX, nullptr);
}

bool Sync::reached(int q, uint32_t p) const {
  return phase_at_least(seg_->state(q).phase.load(std::memory_order_acquire), p);
}

bool Sync::peer_exited(int q) {
  if (pidfds_[q] >= 0) {
    pollfd fd{pidfds_[q], POLLIN, 0};
    return ::poll(&fd, 1, 0) > 0;  // readable once the process terminated
  }
  return pids_[q] > 0 && ::kill(pids_[q], 0) != 0 && errno == ESRCH;
}

void Sync::sleep_on(int q, uint32_t seen, Clock::time_point deadline) {
  RankState& peer = seg_->state(q);
  auto slice = std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now());
  if (slice <= Clock::duration::zero()) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (peer.phase.load(std::memory_order_seq_cst) == seen) futex(&peer.phase, FUTEX_WAIT, seen, &ts);
  peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

WaitFailure Sync::wait_all(uint32_t p, Clock::time_point deadline, int only) {
  const int first = only >= 0 ? only : 0;
  const int last = only >= 0 ? only + 1 : size_;
  int q = first;
  auto next_missing = [&] {
    while (q < last && (q == rank_ || reached(q, p))) ++q;
    return q < last;
  };
  const Header& h = seg_->header();
  // A group that a rank gave up on stays failed: a late peer must not
  // combine its data with a round the others abandoned.
  const bool aborted = h.aborted.load(std::memory_order_relaxed) != 0;
  if (!aborted && !next_missing()) return {};
  // Note [Waiting for peers]: poll, then yield, then sleep.
  const auto start = Clock::now();
  while (!aborted && Clock::now() - start < spin_) {
    for (int i = 0; i < 64; ++i) cpu_relax();
    if (!next_missing()) return {};
  }
  for (int i = 0; i < 8 && !aborted; ++i) {
    ::sched_yield();
    if (!next_missing()) return {};
  }
  for (;;) {
    if (h.aborted.load(std::memory_order_acquire) != 0) {
      WaitFailure f;
      f.kind = WaitFailure::Kind::kAborted;
      f.aborted_by = static_cast<int>(h.aborted.load()) - 1;
      for (int i = 0; i < 1000 && h.reason_ready.load(std::memory_order_acquire) == 0; ++i) std::this_thread::yield();
      if (h.reason_ready.load(std::memory_order_acquire) != 0) f.reason.assign(h.reason, strnlen(h.reason, sizeof(h.reason)));
      return f;
    }
    if (peer_exited(q) && !reached(q, p)) {
      WaitFailure f;
      f.kind = WaitFailure::Kind::kPeerExited;
      f.peers.push_back(q);
      return f;
    }
    if (Clock::now() >= deadline) {
      WaitFailure f;
      f.kind = WaitFailure::Kind::kTimeout;
      for (int r = first; r < last; ++r) {
        if (r != rank_ && !reached(r, p)) f.peers.push_back(r);
      }
      if (f.peers.empty()) return {};
      return f;
    }
    sleep_on(q, seg_->state(q).phase.load(std::memory_order_seq_cst), deadline);
    if (!next_missing()) return {};
  }
}

void Sync::abort(const std::string& reason) {
  Header& h = const_cast<Header&>(seg_->header());
  uint32_t expected = 0;
  if (h.aborted.compare_exchange_strong(expected, static_cast<uint32_t>(rank_ + 1))) {
    const size_t n = std::min(reason.size(), sizeof(h.reason) - 1);
    std::memcpy(h.reason, reason.data(), n);
    h.reason[n] = '\0';
    h.reason_ready.store(1, std::memory_order_release);
  }
  // Wake every sleeper: they check the flag after each sleep.
  for (int q = 0; q < size_; ++q) futex(&seg_->state(q).phase, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace strata::comm::shm::detail
