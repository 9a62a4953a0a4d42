// RAII handles on a PJRT client and what it makes: devices, buffers,
// loaded executables and events.
//
// A Client owns one PJRT_Client; every Buffer and LoadedExecutable it makes
// holds a share of it, so the client is destroyed after the last of them.
// Handles are move-only and destroy their PJRT object exactly once. Every
// failed call throws XlaError (strata/xla/error.h) with the plugin's message
// and code. Nothing here depends on LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/xla/compile_options.h"
#include "strata/xla/element_type.h"
#include "strata/xla/plugin.h"

// PJRT's opaque handles (XLA's header that defines them is private to
// src/xla/).
struct PJRT_Buffer;
struct PJRT_Device;
struct PJRT_Event;
struct PJRT_LoadedExecutable;

namespace strata::xla {

namespace detail {
struct ClientHandle;  // the PJRT_Client and its plugin, shared
}

/// The store through which the processes of one multi-process client find
/// each other (Note [Multi-process clients] in client.cpp): the plugin
/// writes each process's devices under its own keys and reads the others'.
/// Implementations are thread-safe; keys are the plugin's, prefixed by
/// nothing, so one store serves one client per job.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  /// The value of `key`, waiting up to `timeout` for another process to
  /// set it; nullopt when nobody did in time.
  virtual std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
};

/// A KeyValueStore of files in `dir`, which every process of the job can
/// reach (a shared or local folder): one file per key, written whole and
/// renamed into place. The probe's and the tests' store; strata's workers
/// use the rendezvous store instead.
std::shared_ptr<KeyValueStore> directory_store(std::string dir);

/// Options for Client::create.
struct ClientOptions {
  /// Named options for PJRT_Client_Create (cpu_device_count,
  /// preallocate, ...). Only those the plugin accepts are sent
  /// (Note [Create options] in client.cpp); the rest are reported by
  /// Client::dropped_options().
  std::vector<NamedValue> create_options;

  ClientOptions& with_create_option(std::string name, NamedValue::Value value) {
    create_options.push_back({std::move(name), std::move(value)});
    return *this;
  }

  /// One process of a client that spans `num_nodes` processes (one per
  /// node or per device), this one being `node_id`; `store` is shared by
  /// them all. num_nodes == 1 is a one-process client and needs no store.
  int node_id = 0;
  int num_nodes = 1;
  std::shared_ptr<KeyValueStore> store;

  ClientOptions& multi_process(int node, int nodes, std::shared_ptr<KeyValueStore> kv) {
    node_id = node;
    num_nodes = nodes;
    store = std::move(kv);
    return *this;
  }
};

/// Whether a plugin of `kind` can make a client spanning several processes
/// (its create options include node_id and num_nodes): "cuda" and "rocm"
/// can, XLA's CPU plugin cannot.
bool supports_multi_process(std::string_view kind);

/// Parses "NAME=VALUE" from a command line: VALUE true/false is a bool,
/// an integer is an int64, a number with '.' or 'e' a float, anything else
/// a string. Throws ConfigError for text without '=' or an empty name.
NamedValue parse_create_option(const std::string& text);

/// The option names a plugin of `kind` ("cpu", "cuda", "tpu") accepts in
/// PJRT_Client_Create, as its source lists them; empty for other kinds.
const std::vector<std::string>& accepted_create_options(std::string_view kind);

/// The kind of plugin at `path`, from its file name: "cpu", "cuda", "rocm",
/// "tpu", or "" when the name says nothing.
std::string plugin_kind(const std::string& path);

/// A completion event. Await() blocks until it fires and throws the
/// plugin's error if it carries one.
class Event {
 public:
  Event() = default;
  Event(std::shared_ptr<const Plugin> plugin, PJRT_Event* event);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event();

  /// Waits for the event; a no-op on an empty Event.
  void await(std::string_view what);

 private:
  void reset();
  std::shared_ptr<const Plugin> plugin_;
  PJRT_Event* event_ = nullptr;
};

/// A device of a client (non-owning: the client owns its devices).
struct Device {
  PJRT_Device* handle = nullptr;
  int id = 0;             ///< global device id (DeviceAssignment's unit)
  int process_index = 0;  ///< the process that can address it
  std::string kind;       ///< "cpu", "NVIDIA H200", ...
  std::string description;
};

/// A device buffer.
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<detail::ClientHandle> client, PJRT_Buffer* buffer);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  PJRT_Buffer* handle() const { return buffer_; }
  ElementType element_type() const;
  std::vector<int64_t> dims() const;
  /// Bytes of the dense, row-major host copy.
  size_t byte_size() const;
  /// Copies the buffer to `dst` (byte_size() bytes, row-major) and waits.
  /// Throws XlaError when `size` differs from byte_size().
  void to_host(void* dst, size_t size) const;
  /// The buffer's bytes, row-major.
  std::vector<uint8_t> to_host() const;

 private:
  void reset();
  std::shared_ptr<detail::ClientHandle> client_;
  PJRT_Buffer* buffer_ = nullptr;
};

/// A compiled program, loaded on the client's devices.
class LoadedExecutable {
 public:
  LoadedExecutable() = default;
  LoadedExecutable(std::shared_ptr<detail::ClientHandle> client, PJRT_LoadedExecutable* exe);
  LoadedExecutable(LoadedExecutable&& other) noexcept;
  LoadedExecutable& operator=(LoadedExecutable&& other) noexcept;
  ~LoadedExecutable();

  /// Outputs per device.
  size_t num_outputs() const;

  /// Runs the program once on each of `arguments.size()` devices (the
  /// devices of the compile options' assignment that this process
  /// addresses, in replica order): `arguments[d]` are device d's inputs,
  /// already on device d. Waits for every device and returns
  /// outputs[d][i]. In a multi-process client each process passes only its
  /// own devices' lists (Note [Multi-process clients] in key_value.cpp).
  std::vector<std::vector<Buffer>> execute(const std::vector<std::vector<const Buffer*>>& arguments) const;

 private:
  void reset();
  std::shared_ptr<detail::ClientHandle> client_;
  PJRT_LoadedExecutable* exe_ = nullptr;
};

/// A PJRT client: the entry to one plugin's devices.
class Client {
 public:
  /// Creates a client of `plugin`, sending only the create options the
  /// plugin accepts. Throws XlaError when the plugin refuses.
  static Client create(std::shared_ptr<const Plugin> plugin, const ClientOptions& options = {});

  const Plugin& plugin() const;
  std::string platform_name() const;
  std::string platform_version() const;
  int process_index() const;
  /// Every device of the job, and the ones this process can address.
  std::vector<Device> devices() const;
  std::vector<Device> addressable_devices() const;
  /// The options sent to PJRT_Client_Create, and those left out because
  /// the plugin does not list them.
  const std::vector<NamedValue>& sent_options() const { return sent_; }
  const std::vector<std::string>& dropped_options() const { return dropped_; }

  /// Copies `dims`-shaped, row-major host data of `type` to `device` and
  /// waits until the host memory is no longer needed. `size` must equal
  /// the element count times element_size(type).
  Buffer buffer_from_host(const void* data, size_t size, ElementType type, const std::vector<int64_t>& dims,
                          const Device& device) const;

  /// Compiles a StableHLO module given as MLIR text (format "mlir").
  LoadedExecutable compile(const std::string& mlir_text, const CompileOptions& options) const;

 private:
  std::shared_ptr<detail::ClientHandle> client_;
  std::vector<NamedValue> sent_;
  std::vector<std::string> dropped_;
};

}  // namespace strata::xla
