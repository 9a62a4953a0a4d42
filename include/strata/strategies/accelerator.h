// Accelerators: the kind of device a strategy trains on. Small objects a
// strategy is handed, as in Lightning: they name the device of each local
// rank and say how many there are.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/backend.h"

namespace at {
class Tensor;
}

namespace strata::strategies {

/// The ranks of one process whose accelerator drives several devices
/// (Note [Ranks as threads] in strategies/xla.h).
struct ThreadRanks {
  std::vector<std::shared_ptr<comm::Backend>> backends;  ///< rank r's collectives, for its thread
  std::function<void(const std::string&)> abort;  ///< stops the ranks that wait for one that failed
  std::function<int64_t()> steps;  ///< the steps the ranks have ended together so far
  /// Pauses the ranks' collectives between runs of their threads, so the
  /// calling thread may use their devices (Note [Paused replicas]), or
  /// resumes them.
  std::function<void(bool)> pause;
  /// Rank r's thread ended its call: a rank that waits for it fails at once.
  std::function<void(int)> finish;
  /// Sets what is called (with the rank) whenever a rank is about to wait
  /// for its peers.
  std::function<void(std::function<void(int)>)> set_on_wait;
};

/// Note [No reads inside a lazy step]
/// On a lazy device (xla) the ops of a step are recorded and run as one
/// program when the step ends; a value read on the host inside the step
/// (.item(), a comparison in an if) runs what was recorded so far as a
/// program of its own, so the step runs as two programs and its middle
/// is materialised. So the Trainer and the strategies never read inside a
/// step where the accelerator says !reads_inside_step(): the loss is
/// checked for NaN, logged values are read, and clip_gradients'
/// error_if_nonfinite is checked after the step ends (end_step(), which
/// Strategy::mark_step() and the device loader's next batch call). The
/// accelerator owns this shape of a step; the generic Strategy and Trainer
/// ask it through the hooks below and never ask which device it is.

/// A kind of device.
class Accelerator {
 public:
  virtual ~Accelerator() = default;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;
  /// The device worker `local_rank` trains on.
  virtual c10::Device device(int local_rank) const = 0;
  /// How many workers to start on this host when the user asks for "auto"
  /// (devices=-1): every visible GPU for "cuda", 1 for "cpu".
  virtual int auto_device_count() const = 0;
  /// Devices one worker process drives when a host runs `devices` of them:
  /// 1 for "cpu" and "cuda" (a process per device). An accelerator whose
  /// runtime drives every local device from one process returns `devices`
  /// (resolve_placement then starts one process per host).
  virtual int devices_per_process(int devices) const { return 1; }

  // ---- the shape of a step (Note [No reads inside a lazy step]) ----------
  /// Whether a value a step computes may be read on the host inside the
  /// step: true on the eager "cpu" and "cuda"; false on "xla", whose device
  /// records the step and runs it as one program when the step ends.
  virtual bool reads_inside_step() const { return true; }
  /// Ends a step: runs what the device recorded and the checks deferred to
  /// the step's end (check_at_step_end). Nothing on an eager device.
  /// Throws the first failed deferred check's strata::Error.
  virtual void end_step() const {}
  /// Checks `ok`, a one-element bool tensor computed by the step: throws
  /// strata::Error(`message`) when it is false. Read at once where
  /// reads_inside_step(), else at the next end_step(), after the step ran.
  virtual void check_at_step_end(const at::Tensor& ok, const std::string& message) const;
  /// Whether the device computes in float64; where not (TPUs), reductions
  /// that would take it (a gradient norm's sum) take float32.
  virtual bool has_float64() const { return true; }
  /// The programs this process compiled for the device so far and why the
  /// last one was: a device that compiles its steps (xla) counts them, an
  /// eager one compiles none.
  struct CompiledPrograms {
    int64_t count = 0;
    std::string last_reason;  ///< "" when none was compiled
  };
  virtual CompiledPrograms compiled_programs() const { return {}; }
  /// For an accelerator whose devices_per_process is above 1: the
  /// collectives of `ranks` ranks run as threads of this process, rank r on
  /// device(r), whose waits end with a TimeoutError after `timeout`. The
  /// default throws ConfigError.
  virtual ThreadRanks thread_ranks(int ranks, std::chrono::milliseconds timeout) const;
};

/// Note [Device placement]
/// One worker per device. Worker LOCAL_RANK trains on cuda:LOCAL_RANK and
/// makes it the current device before any collective starts. The index
/// counts the GPUs this process can see: CUDA_VISIBLE_DEVICES (read by the
/// CUDA runtime, never changed by strata) picks and orders them, so
/// CUDA_VISIBLE_DEVICES=2,3 puts local rank 0 on physical GPU 2. When a
/// launcher gives each worker exactly one GPU (CUDA_VISIBLE_DEVICES naming
/// one device, as SLURM's --gpus-per-task does), every local rank uses
/// cuda:0, the only one it sees. Anything else that points past the
/// visible GPUs is a ConfigError that says how many there are.

/// The number of workers per host for `requested` devices of `kind`
/// ("cpu" or "cuda") when `available` devices of that kind are visible:
/// -1 means one per visible device (1 on "cpu", where a worker is a
/// process and any number may run). Throws ConfigError when no GPU is
/// visible, or when more GPUs are asked for than there are, naming how
/// many there are and CUDA_VISIBLE_DEVICES (`visible_devices`, unset:
/// nullptr).
int resolve_devices(const std::string& kind, int requested, int available,
                    const char* visible_devices = nullptr);

/// resolve_devices for `accelerator` on this machine (its auto_device_count
/// and this process's CUDA_VISIBLE_DEVICES).
int resolve_devices(const Accelerator& accelerator, int requested);

/// The index of the GPU worker `local_rank` uses when the process sees
/// `available` GPUs (Note [Device placement]); `visible_devices` is
/// CUDA_VISIBLE_DEVICES (nullptr: unset). Throws ConfigError when that GPU
/// does not exist.
int cuda_device_index(int local_rank, int available, const char* visible_devices);

/// Makes `device` the current device of the calling thread (cudaSetDevice
/// for CUDA, through LibTorch's device-generic guard); nothing for CPU.
void set_current_device(c10::Device device);

/// True when this CPU multiplies bfloat16 matrices natively (x86:
/// AVX512-BF16 or AMX-BF16; Arm: the BF16 extension), which LibTorch's
/// oneDNN kernels use; without it a bfloat16 matmul runs through a generic
/// kernel, 10-60x slower than float32 (docs/benchmarks.md).
bool cpu_has_native_bf16();

/// Every worker on the CPU.
std::shared_ptr<Accelerator> cpu_accelerator();

/// Returns the accelerator called `name`: "cpu", "cuda", "gpu" (= cuda) or
/// "auto" (cuda when available, else cpu). "xla"/"tpu" and unavailable
/// devices are refused with a ConfigError that says what is supported.
std::shared_ptr<Accelerator> make_accelerator(const std::string& name);

}  // namespace strata::strategies
