// The xla device's registration and process state: finding the plugin,
// the client, the device guard, LibTorch's PrivateUse1 hooks, the
// generators, mark_step and the metrics.
//
// Note [Registered at init, not at load]
// Everything the device adds to LibTorch (the PrivateUse1 name, the guard,
// the hooks, the allocator, the kernels and the fallback) is registered by
// init(), never by static initialisers. A process that never asks for the
// xla device is unchanged: LibTorch's autograd engine asks every registered
// guard for its device count at the first backward, and a guard registered
// at load would load the PJRT plugin in every CPU run. And a process that
// registered another PrivateUse1 backend (an out-of-tree device) keeps it:
// init() refuses before registering anything, where a static fallback for
// PrivateUse1 would have collided with that backend's at load time.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/xla_device/device.h"
#include "strata/xla/error.h"
#include "lazy_buffer.h"
#include "runtime.h"

namespace strata::xla {
namespace detail {
namespace {

constexpr c10::DeviceType kXla = c10::DeviceType::PrivateUse1;

struct State {
  std::shared_ptr<const Plugin> plugin;
  std::shared_ptr<Client> client;
  std::vector<Device> devices;
  std::deque<at::Generator> generators;  // one per device
};

State& state() {
  static auto* s = new State();  // used by kernels until exit: never destroyed
  return *s;
}
std::atomic<bool> initialized{false};

thread_local c10::DeviceIndex tls_device = 0;

// Counters (metrics()).
std::mutex metrics_mutex;
Metrics counters;
std::set<std::string> reported;  // ops reported once (never reset)

c10::DeviceIndex checked(c10::DeviceIndex index) {
  if (index < 0) return tls_device;
  STRATA_CHECK(index < addressable_device_count(), ConfigError, "[xla] device xla:", static_cast<int>(index),
               " does not exist: the plugin's client has ", addressable_device_count(), " device(s)");
  return index;
}

// The device guard: one default stream per device, the current device
// per thread. Autograd's engine uses getStream/exchangeStream/setDevice.
class XlaGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kXla; }
  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device old(kXla, tls_device);
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override { return {kXla, tls_device}; }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kXla, "[xla] the xla device guard was given ", device);
    if (device.has_index()) tls_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) tls_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device.has_index() ? device : getDevice());
  }
  c10::Stream getDefaultStream(c10::Device device) const override { return getStream(device); }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override { return getStream(device); }
  c10::Stream getNewStream(c10::Device device, int) const override { return getStream(device); }
  c10::Stream exchangeStream(c10::Stream stream) const override { return getStream(stream.device()); }
  c10::DeviceIndex deviceCount() const noexcept override {
    return initialized.load() ? static_cast<c10::DeviceIndex>(state().devices.size()) : 0;
  }
  // One stream per device, and every transfer waits: nothing to order.
  void synchronizeStream(const c10::Stream&) const override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeDevice(c10::DeviceIndex) const override {}
};

// LibTorch's PrivateUse1 hooks (at::empty on the device needs them;
// manual_seed asks them for the default generator).
class XlaHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  void init() const override { strata::xla::init(); }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(state().devices.size());
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return initialized.load(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom());
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return {kXla, static_cast<c10::DeviceIndex>(static_cast<LazyBuffer*>(data)->device_index())};
  }
  void setCurrentDevice(c10::DeviceIndex index) const override { tls_device = index; }
  c10::DeviceIndex getCurrentDevice() const override { return tls_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = tls_device;
    tls_device = index;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    grow_storage(*storage.unsafeGetStorageImpl(), nbytes);
  }
};

void add_site_packages(const std::filesystem::path& prefix, std::vector<std::filesystem::path>& out) {
  std::error_code ec;
  const auto lib = prefix / "lib";
  if (!std::filesystem::is_directory(lib, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(lib, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("python3", 0) == 0) out.push_back(entry.path() / "site-packages");
  }
}

// The site-packages folders that may hold a plugin wheel, most specific
// first: the LibTorch wheel's own, then the named environments.
std::vector<std::filesystem::path> site_packages() {
  std::vector<std::filesystem::path> out;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&c10::get_privateuse1_backend), &info) != 0 && info.dli_fname != nullptr) {
    // <site-packages>/torch/lib/libc10.so
    const std::filesystem::path lib(info.dli_fname);
    if (lib.parent_path().filename() == "lib" && lib.parent_path().parent_path().filename() == "torch")
      out.push_back(lib.parent_path().parent_path().parent_path());
  }
  for (const char* var : {"VIRTUAL_ENV", "STRATA_VENV"}) {
    const char* value = std::getenv(var);
    if (value != nullptr && *value != '\0') add_site_packages(value, out);
  }
  if (const char* python = std::getenv("STRATA_PYTHON"); python != nullptr && *python != '\0')
    add_site_packages(std::filesystem::path(python).parent_path().parent_path(), out);
  return out;
}

}  // namespace

const Client& client() {
  if (!initialized.load()) throw XlaError("[xla] the xla device is not initialised; call strata::xla::init()");
  return *state().client;
}

std::shared_ptr<const Client> shared_client() {
  client();  // throws before init()
  return state().client;
}

int addressable_device_count() { return initialized.load() ? static_cast<int>(state().devices.size()) : 0; }

const Device& pjrt_device(int index) {
  const auto& devices = state().devices;
  STRATA_CHECK(index >= 0 && index < static_cast<int>(devices.size()), ConfigError, "[xla] device xla:", index,
               " does not exist: the plugin's client has ", devices.size(), " device(s)");
  return devices[static_cast<size_t>(index)];
}

c10::DeviceIndex current_device() { return tls_device; }
void set_current_device(c10::DeviceIndex index) { tls_device = index; }

// Note [Generators on the host]
// Random ops run through the CPU fallback, so each xla device's default
// generator is a CPU generator of its own: manual_seed seeds it (through
// the hooks), the fallback hands it to the CPU kernel in place of a missing
// generator, and drawing on xla leaves the CPU's stream alone. With the
// same seed, xla draws what a fresh CPU generator draws. A lowering of the
// random ops (rng_bit_generator) will replace it.
const at::Generator& default_generator(c10::DeviceIndex index) {
  strata::xla::init();
  return state().generators.at(static_cast<size_t>(checked(index)));
}

double seconds(std::chrono::nanoseconds took) { return std::chrono::duration<double>(took).count(); }

void count_upload(size_t bytes, std::chrono::nanoseconds took) {
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++counters.host_to_device_count;
  counters.host_to_device_bytes += static_cast<int64_t>(bytes);
  counters.transfer_seconds += seconds(took);
}

void count_download(size_t bytes, std::chrono::nanoseconds took) {
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++counters.device_to_host_count;
  counters.device_to_host_bytes += static_cast<int64_t>(bytes);
  counters.transfer_seconds += seconds(took);
}

bool count_fallback(const std::string& op) {
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++counters.fallbacks[op];
  return reported.insert(op).second;
}

void count_lowered(const char* op, int64_t nodes, std::chrono::nanoseconds took) {
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++counters.lowered[op];
  counters.nodes_recorded += nodes;
  counters.trace_seconds += seconds(took);
}

}  // namespace detail

PluginSearch find_plugin() {
  PluginSearch search;
  if (const char* env = std::getenv("STRATA_PJRT_PLUGIN"); env != nullptr && *env != '\0') {
    search.looked.push_back(env);
    STRATA_CHECK(std::filesystem::exists(env), ConfigError, "[xla] STRATA_PJRT_PLUGIN=", env,
                 " does not exist; point it at a PJRT plugin (.so), or unset it to use the CPU plugin of the "
                 "Python environment");
    search.path = env;
    search.source = "STRATA_PJRT_PLUGIN";
    return search;
  }
  // The CPU plugin wheels the project's environment installs
  // (scripts/requirements.txt), in order of preference.
  static const char* const kCandidates[] = {"lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
                                            "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"};
  std::error_code ec;
  for (const auto& site : detail::site_packages()) {
    for (const char* candidate : kCandidates) {
      const auto path = site / candidate;
      search.looked.push_back(path.string());
      if (std::filesystem::exists(path, ec)) {
        search.path = path.string();
        search.source = site.string();
        return search;
      }
    }
  }
  std::string looked;
  for (const auto& path : search.looked) looked += "\n  " + path;
  if (looked.empty()) looked = "\n  (no Python environment found: neither the LibTorch wheel nor $VIRTUAL_ENV, "
                               "$STRATA_VENV or $STRATA_PYTHON)";
  throw ConfigError("[xla] no PJRT plugin found: set STRATA_PJRT_PLUGIN to a plugin (.so), or install the CPU "
                    "plugin wheel (pip install lammps-jax-pjrt-cpu, as scripts/install-deps.sh does). Looked at:" +
                    looked);
}

namespace {

// Note [The CPU plugin's temporaries stay mapped]
// The CPU plugin allocates each execution's temporary arena (119.5 MiB for
// GPT small's step) with malloc on its own threads and frees it after. A
// thread's malloc arena holds at most 64 MiB, so glibc maps every such
// request with mmap and unmaps it on free, and each of its pages faults
// in, and is cleared, at every execution (30,000 faults a step on GPT
// small; docs/benchmarks.md). glibc's settings keep it only in the main
// arena, which grows by brk without a bound: so before the plugin's
// threads start, every thread is sent to the main arena (M_ARENA_MAX 1),
// large requests are served from it (M_MMAP_MAX 0) and its top is not
// returned (M_TRIM_THRESHOLD at its maximum). The arena's pages then stay
// mapped from step to step. The cost: the process's freed memory is kept
// for reuse rather than returned to the system, and its threads share
// one arena's lock. Only for a CPU plugin (its file name says "cpu"),
// whose executions use host memory; STRATA_XLA_HOST_MALLOC=system leaves
// glibc's settings alone, =keep applies them for any plugin.
void keep_host_arena(const std::string& plugin_path) {
  const char* env = std::getenv("STRATA_XLA_HOST_MALLOC");
  const std::string choice = env == nullptr ? "" : env;
  STRATA_CHECK(choice.empty() || choice == "keep" || choice == "system", ConfigError,
               "[xla] STRATA_XLA_HOST_MALLOC=", choice,
               " is not a setting: 'keep' keeps the plugin's temporaries mapped between executions, 'system' "
               "leaves glibc's malloc settings alone; unset, a CPU plugin keeps them");
  const bool cpu = std::filesystem::path(plugin_path).filename().string().find("cpu") != std::string::npos;
  if (choice == "system" || (choice.empty() && !cpu)) return;
#if defined(__GLIBC__)
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_MAX, 0);
  ::mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Note [Registered at init, not at load]
    if (c10::is_privateuse1_backend_registered()) {
      const std::string name = c10::get_privateuse1_backend();
      STRATA_CHECK(name == "xla", ConfigError, "[xla] this process already registered the PrivateUse1 device as '",
                   name, "', so strata cannot register its xla device; use one out-of-tree device per process");
    }
    const PluginSearch search = find_plugin();
    keep_host_arena(search.path);  // before the plugin's threads start
    auto& s = detail::state();
    s.plugin = Plugin::load(search.path);
    s.client = std::make_shared<Client>(Client::create(s.plugin));
    s.devices = s.client->addressable_devices();
    STRATA_CHECK(!s.devices.empty(), ConfigError, "[xla] the PJRT plugin ", search.path,
                 " addresses no device from this process");
    for (size_t i = 0; i < s.devices.size(); ++i)
      s.generators.push_back(at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom()));

    if (!c10::is_privateuse1_backend_registered()) c10::register_privateuse1_backend("xla");
    static c10::impl::DeviceGuardImplRegistrar guard(detail::kXla, new detail::XlaGuard());
    at::RegisterPrivateUse1HooksInterface(new detail::XlaHooks());
    c10::SetAllocator(detail::kXla, detail::allocator());
    detail::register_kernels();
    detail::initialized.store(true);
    log::debug("[xla] device registered: ", s.devices.size(), " device(s) of ", s.client->platform_name(),
               " from ", search.path);
  });
  // A failed first call leaves nothing registered and throws; call_once
  // lets a later call try again.
}

bool is_initialized() { return detail::initialized.load(); }

int device_count() {
  init();
  return detail::addressable_device_count();
}

c10::Device device(int index) {
  init();
  STRATA_CHECK(index >= 0 && index < detail::addressable_device_count(), ConfigError, "[xla] device xla:", index,
               " does not exist: the plugin's client has ", detail::addressable_device_count(), " device(s)");
  return {detail::kXla, static_cast<c10::DeviceIndex>(index)};
}

namespace detail {
namespace {

struct DeferredCheck {
  at::Tensor ok;
  std::string message;
};
std::mutex checks_mutex;
std::vector<DeferredCheck> checks;

// The checks check_after_step registered, read once the step has run (a
// download each; a failing one throws). A replica's checks are its own
// thread's (Note [Replicas in one process] in recorder.cpp): another
// replica's step may not have run yet, and only its thread may read it.
void run_deferred_checks() {
  const c10::DeviceIndex here = current_device();
  std::vector<DeferredCheck> due;
  {
    std::lock_guard<std::mutex> lock(checks_mutex);
    std::vector<DeferredCheck> others;
    for (DeferredCheck& check : checks) {
      const c10::DeviceIndex device = check.ok.device().index();
      (device == here || !is_replica_device(device) ? due : others).push_back(std::move(check));
    }
    checks.swap(others);
  }
  for (const DeferredCheck& check : due) {
    if (!check.ok.cpu().item<bool>()) throw Error(check.message);
  }
}

}  // namespace
}  // namespace detail

void check_after_step(const at::Tensor& ok, std::string message) {
  STRATA_CHECK(ok.defined() && ok.numel() == 1 && ok.scalar_type() == at::kBool, ConfigError,
               "[xla] check_after_step needs a one-element bool tensor, got ",
               ok.defined() ? ok.toString() : std::string("an undefined tensor"),
               "; compare first (e.g. norm.isfinite())");
  std::lock_guard<std::mutex> lock(detail::checks_mutex);
  detail::checks.push_back({ok.detach(), std::move(message)});
}

void mark_step() {
  if (!is_initialized()) return;
  // Note [One program per step] (recorder.cpp). Every transfer has
  // completed when its call returns; what the step leaves behind is the
  // host copies the fallback made.
  if (detail::sync_pending()) {
    std::lock_guard<std::mutex> lock(detail::metrics_mutex);
    ++detail::counters.steps;
  }
  detail::run_deferred_checks();  // reads results of the step: before their host copies go
  detail::release_host_copies();
}

int64_t Metrics::fallback_calls() const {
  int64_t total = 0;
  for (const auto& [op, n] : fallbacks) total += n;
  return total;
}

Metrics metrics() {
  Metrics out;
  {
    std::lock_guard<std::mutex> lock(detail::metrics_mutex);
    out = detail::counters;
  }
  detail::graph_metrics(out);
  return out;
}

std::string summary(const Metrics& m) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%lld step%s: %lld program%s compiled (%.2f s), %lld cache hit%s, %lld execution%s (%.2f s), "
                "trace %.2f s, transfers %.1f MB up %.1f MB down (%.2f s), ",
                static_cast<long long>(m.steps), m.steps == 1 ? "" : "s", static_cast<long long>(m.compiles),
                m.compiles == 1 ? "" : "s", m.compile_seconds, static_cast<long long>(m.cache_hits),
                m.cache_hits == 1 ? "" : "s", static_cast<long long>(m.executions), m.executions == 1 ? "" : "s",
                m.execute_seconds, m.trace_seconds, static_cast<double>(m.host_to_device_bytes) / 1e6,
                static_cast<double>(m.device_to_host_bytes) / 1e6, m.transfer_seconds);
  std::string out = buf;
  if (m.fallbacks.empty()) return out + "no CPU fallback";
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [op, n] : m.fallbacks) by_count.emplace_back(-n, op);
  std::sort(by_count.begin(), by_count.end());
  out += std::to_string(m.fallback_calls()) + " CPU fallback call(s):";
  for (size_t i = 0; i < by_count.size() && i < 5; ++i)
    out += " " + by_count[i].second + " x" + std::to_string(-by_count[i].first);
  if (by_count.size() > 5) out += " and " + std::to_string(by_count.size() - 5) + " more op(s)";
  return out;
}

void reset_metrics() {
  {
    std::lock_guard<std::mutex> lock(detail::metrics_mutex);
    detail::counters = Metrics{};
  }
  detail::reset_graph_metrics();
}

}  // namespace strata::xla
