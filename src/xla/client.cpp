// Client, Buffer, LoadedExecutable and Event over the PJRT C API.
#include "strata/xla/client.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <numeric>

#include "key_value.h"
#include "pjrt_api.h"
#include "plugin_call.h"

namespace strata::xla {

namespace detail {
struct ClientHandle {
  std::shared_ptr<const Plugin> plugin;
  PJRT_Client* client = nullptr;
  std::shared_ptr<KeyValueStore> store;  // a multi-process client's; destroyed after the client

  ~ClientHandle() {
    if (client == nullptr || !plugin->has(&PJRT_Api::PJRT_Client_Destroy)) return;
    auto args = STRATA_PJRT_ARGS(PJRT_Client_Destroy_Args);
    args.client = client;
    // A destructor cannot throw; a failed destroy is a leak and nothing more.
    try {
      plugin->call(&PJRT_Api::PJRT_Client_Destroy, args, "PJRT_Client_Destroy");
    } catch (const XlaError&) {
    }
  }
};
}  // namespace detail

namespace {


// Note [Create options]
// PJRT_Client_Create takes named options, and recent plugins refuse a
// client whose options include a name they do not know ("Unexpected option
// name passed to PJRT_Client_Create"). The C API has no call that lists the
// names, so strata keeps each kind of plugin's list, as its source declares
// it (XLA's pjrt_c_api_cpu_internal.cc and pjrt_c_api_gpu_internal.cc), and
// sends only the requested options on that list. The others are dropped
// and reported (Client::dropped_options, `strata xla-probe`'s JSON), never
// sent. A plugin of unknown kind gets no options at all.
const std::vector<std::string> kCpuOptions = {"cpu_device_count", "asynchronous"};
const std::vector<std::string> kGpuOptions = {
    "platform_name",   "allocator", "memory_fraction", "preallocate",      "collective_memory_size",
    "visible_devices", "node_id",   "num_nodes",       "enable_mock_nccl", "mock_gpu_topology"};
const std::vector<std::string> kNoOptions = {};

std::string text_of(const char* data, size_t size) { return data != nullptr ? std::string(data, size) : ""; }

Device describe(const Plugin& plugin, PJRT_Device* handle) {
  Device device;
  device.handle = handle;
  auto get = STRATA_PJRT_ARGS(PJRT_Device_GetDescription_Args);
  get.device = handle;
  plugin.call(&PJRT_Api::PJRT_Device_GetDescription, get, "PJRT_Device_GetDescription");
  auto id = STRATA_PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
  id.device_description = get.device_description;
  plugin.call(&PJRT_Api::PJRT_DeviceDescription_Id, id, "PJRT_DeviceDescription_Id");
  device.id = id.id;
  auto process = STRATA_PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args);
  process.device_description = get.device_description;
  plugin.call(&PJRT_Api::PJRT_DeviceDescription_ProcessIndex, process, "PJRT_DeviceDescription_ProcessIndex");
  device.process_index = process.process_index;
  auto kind = STRATA_PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  kind.device_description = get.device_description;
  plugin.call(&PJRT_Api::PJRT_DeviceDescription_Kind, kind, "PJRT_DeviceDescription_Kind");
  device.kind = text_of(kind.device_kind, kind.device_kind_size);
  auto text = STRATA_PJRT_ARGS(PJRT_DeviceDescription_ToString_Args);
  text.device_description = get.device_description;
  plugin.call(&PJRT_Api::PJRT_DeviceDescription_ToString, text, "PJRT_DeviceDescription_ToString");
  device.description = text_of(text.to_string, text.to_string_size);
  return device;
}

}  // namespace

bool supports_multi_process(std::string_view kind) {
  const std::vector<std::string>& accepted = accepted_create_options(kind);
  return std::find(accepted.begin(), accepted.end(), "num_nodes") != accepted.end() &&
         std::find(accepted.begin(), accepted.end(), "node_id") != accepted.end();
}

const std::vector<std::string>& accepted_create_options(std::string_view kind) {
  if (kind == "cpu") return kCpuOptions;
  if (kind == "cuda" || kind == "rocm") return kGpuOptions;
  return kNoOptions;
}

NamedValue parse_create_option(const std::string& text) {
  const size_t eq = text.find('=');
  STRATA_CHECK(eq != std::string::npos && eq > 0, ConfigError, "[pjrt] create option '", text,
               "' is not NAME=VALUE (e.g. cpu_device_count=2, preallocate=false)");
  STRATA_CHECK(text.size() < 4096, ConfigError, "[pjrt] create option of ", text.size(),
               " bytes; keep it under 4096");
  NamedValue out{text.substr(0, eq), std::string()};
  const std::string value = text.substr(eq + 1);
  if (value == "true" || value == "false") {
    out.value = value == "true";
    return out;
  }
  char* end = nullptr;
  errno = 0;
  const long long integer = std::strtoll(value.c_str(), &end, 10);
  if (!value.empty() && *end == '\0' && errno == 0) {
    out.value = static_cast<int64_t>(integer);
    return out;
  }
  if (value.find_first_of(".eE") != std::string::npos) {
    const float f = std::strtof(value.c_str(), &end);
    if (!value.empty() && *end == '\0') {
      out.value = f;
      return out;
    }
  }
  out.value = value;
  return out;
}

std::string plugin_kind(const std::string& path) {
  std::string name =
      path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* kind : {"cuda", "rocm", "tpu", "cpu"})
    if (name.find(kind) != std::string::npos) return kind;
  return "";
}

// ---- Event --------------------------------------------------------------------

Event::Event(std::shared_ptr<const Plugin> plugin, PJRT_Event* event)
    : plugin_(std::move(plugin)), event_(event) {}
Event::Event(Event&& other) noexcept : plugin_(std::move(other.plugin_)), event_(other.event_) {
  other.event_ = nullptr;
}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    plugin_ = std::move(other.plugin_);
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}
Event::~Event() { reset(); }

void Event::reset() {
  if (event_ == nullptr) return;
  auto args = STRATA_PJRT_ARGS(PJRT_Event_Destroy_Args);
  args.event = event_;
  event_ = nullptr;
  try {
    plugin_->call(&PJRT_Api::PJRT_Event_Destroy, args, "PJRT_Event_Destroy");
  } catch (const XlaError&) {
  }
}

void Event::await(std::string_view what) {
  if (event_ == nullptr) return;
  auto args = STRATA_PJRT_ARGS(PJRT_Event_Await_Args);
  args.event = event_;
  plugin_->call(&PJRT_Api::PJRT_Event_Await, args, what);
}

// ---- Buffer -------------------------------------------------------------------

Buffer::Buffer(std::shared_ptr<detail::ClientHandle> client, PJRT_Buffer* buffer)
    : client_(std::move(client)), buffer_(buffer) {}
Buffer::Buffer(Buffer&& other) noexcept : client_(std::move(other.client_)), buffer_(other.buffer_) {
  other.buffer_ = nullptr;
}
Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    client_ = std::move(other.client_);
    buffer_ = other.buffer_;
    other.buffer_ = nullptr;
  }
  return *this;
}
Buffer::~Buffer() { reset(); }

void Buffer::reset() {
  if (buffer_ == nullptr) return;
  auto args = STRATA_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  buffer_ = nullptr;
  try {
    client_->plugin->call(&PJRT_Api::PJRT_Buffer_Destroy, args, "PJRT_Buffer_Destroy");
  } catch (const XlaError&) {
  }
}

ElementType Buffer::element_type() const {
  STRATA_CHECK(buffer_ != nullptr, xla::XlaError, "[pjrt] element_type() of an empty Buffer");
  auto args = STRATA_PJRT_ARGS(PJRT_Buffer_ElementType_Args);
  args.buffer = buffer_;
  client_->plugin->call(&PJRT_Api::PJRT_Buffer_ElementType, args, "PJRT_Buffer_ElementType");
  return from_pjrt_buffer_type(args.type);
}

std::vector<int64_t> Buffer::dims() const {
  STRATA_CHECK(buffer_ != nullptr, xla::XlaError, "[pjrt] dims() of an empty Buffer");
  auto args = STRATA_PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  args.buffer = buffer_;
  client_->plugin->call(&PJRT_Api::PJRT_Buffer_Dimensions, args, "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(args.dims, args.dims + args.num_dims);
}

size_t Buffer::byte_size() const {
  STRATA_CHECK(buffer_ != nullptr, xla::XlaError, "[pjrt] byte_size() of an empty Buffer");
  // With dst null, PJRT_Buffer_ToHostBuffer only reports the size it needs.
  auto args = STRATA_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer_;
  client_->plugin->call(&PJRT_Api::PJRT_Buffer_ToHostBuffer, args, "PJRT_Buffer_ToHostBuffer (size query)");
  return args.dst_size;
}

void Buffer::to_host(void* dst, size_t size) const {
  const size_t need = byte_size();
  STRATA_CHECK(size == need, xla::XlaError, "[pjrt] to_host: the destination holds ", size,
               " bytes, the buffer needs ", need);
  auto args = STRATA_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer_;
  args.dst = dst;
  args.dst_size = size;
  client_->plugin->call(&PJRT_Api::PJRT_Buffer_ToHostBuffer, args, "PJRT_Buffer_ToHostBuffer");
  Event(client_->plugin, args.event).await("PJRT_Buffer_ToHostBuffer (await)");
}

std::vector<uint8_t> Buffer::to_host() const {
  std::vector<uint8_t> out(byte_size());
  to_host(out.data(), out.size());
  return out;
}

// ---- LoadedExecutable -------------------------------------------------------

LoadedExecutable::LoadedExecutable(std::shared_ptr<detail::ClientHandle> client,
                                   PJRT_LoadedExecutable* exe)
    : client_(std::move(client)), exe_(exe) {}
LoadedExecutable::LoadedExecutable(LoadedExecutable&& other) noexcept
    : client_(std::move(other.client_)), exe_(other.exe_) {
  other.exe_ = nullptr;
}
LoadedExecutable& LoadedExecutable::operator=(LoadedExecutable&& other) noexcept {
  if (this != &other) {
    reset();
    client_ = std::move(other.client_);
    exe_ = other.exe_;
    other.exe_ = nullptr;
  }
  return *this;
}
LoadedExecutable::~LoadedExecutable() { reset(); }

void LoadedExecutable::reset() {
  if (exe_ == nullptr) return;
  auto args = STRATA_PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = exe_;
  exe_ = nullptr;
  try {
    client_->plugin->call(&PJRT_Api::PJRT_LoadedExecutable_Destroy, args, "PJRT_LoadedExecutable_Destroy");
  } catch (const XlaError&) {
  }
}

size_t LoadedExecutable::num_outputs() const {
  STRATA_CHECK(exe_ != nullptr, xla::XlaError, "[pjrt] num_outputs() of an empty LoadedExecutable");
  const Plugin& plugin = *client_->plugin;
  auto get = STRATA_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe_;
  plugin.call(&PJRT_Api::PJRT_LoadedExecutable_GetExecutable, get, "PJRT_LoadedExecutable_GetExecutable");
  auto count = STRATA_PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  count.executable = get.executable;
  PJRT_Error* error = plugin.api().PJRT_Executable_NumOutputs(&count);
  auto destroy = STRATA_PJRT_ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  plugin.call(&PJRT_Api::PJRT_Executable_Destroy, destroy, "PJRT_Executable_Destroy");
  plugin.check(error, "PJRT_Executable_NumOutputs");
  return count.num_outputs;
}

std::vector<std::vector<Buffer>> LoadedExecutable::execute(
    const std::vector<std::vector<const Buffer*>>& arguments) const {
  STRATA_CHECK(exe_ != nullptr, xla::XlaError, "[pjrt] execute() of an empty LoadedExecutable");
  STRATA_CHECK(!arguments.empty(), xla::XlaError,
               "[pjrt] execute() needs the arguments of at least one device");
  const size_t num_devices = arguments.size();
  const size_t num_args = arguments[0].size();
  std::vector<std::vector<PJRT_Buffer*>> inputs(num_devices);
  std::vector<PJRT_Buffer* const*> input_lists(num_devices);
  for (size_t d = 0; d < num_devices; ++d) {
    STRATA_CHECK(arguments[d].size() == num_args, xla::XlaError, "[pjrt] execute(): device ", d, " has ",
                 arguments[d].size(), " arguments, device 0 has ", num_args);
    for (const Buffer* b : arguments[d]) {
      STRATA_CHECK(b != nullptr && b->handle() != nullptr, xla::XlaError, "[pjrt] execute(): device ", d,
                   " has an empty argument buffer");
      inputs[d].push_back(b->handle());
    }
    input_lists[d] = inputs[d].data();
  }
  const size_t num_out = num_outputs();
  std::vector<std::vector<PJRT_Buffer*>> outputs(num_devices, std::vector<PJRT_Buffer*>(num_out));
  std::vector<PJRT_Buffer**> output_lists(num_devices);
  for (size_t d = 0; d < num_devices; ++d) output_lists[d] = outputs[d].data();
  std::vector<PJRT_Event*> done(num_devices, nullptr);

  auto options = STRATA_PJRT_ARGS(PJRT_ExecuteOptions);
  auto args = STRATA_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  args.executable = exe_;
  args.options = &options;
  args.argument_lists = input_lists.data();
  args.num_devices = num_devices;
  args.num_args = num_args;
  args.output_lists = output_lists.data();
  args.device_complete_events = done.data();
  client_->plugin->call(&PJRT_Api::PJRT_LoadedExecutable_Execute, args, "PJRT_LoadedExecutable_Execute");

  // Own everything the call returned before waiting, so that an error in
  // one device's event still releases every buffer and event.
  std::vector<std::vector<Buffer>> result(num_devices);
  std::vector<Event> events;
  for (size_t d = 0; d < num_devices; ++d) {
    for (PJRT_Buffer* b : outputs[d]) result[d].emplace_back(client_, b);
    events.emplace_back(client_->plugin, done[d]);
  }
  for (Event& e : events) e.await("PJRT_LoadedExecutable_Execute (device completion)");
  return result;
}

// ---- Client --------------------------------------------------------------------

Client Client::create(std::shared_ptr<const Plugin> plugin, const ClientOptions& options) {
  STRATA_CHECK(plugin != nullptr, ConfigError, "[pjrt] Client::create needs a loaded plugin");
  Client client;
  const std::string kind = plugin_kind(plugin->path());
  const std::vector<std::string>& accepted = accepted_create_options(kind);
  for (const NamedValue& option : options.create_options) {
    STRATA_CHECK(option.name != "node_id" && option.name != "num_nodes", ConfigError, "[pjrt] create option '",
                 option.name, "': set ClientOptions::multi_process instead, which also gives the processes their store");
    if (std::find(accepted.begin(), accepted.end(), option.name) != accepted.end())
      client.sent_.push_back(option);
    else
      client.dropped_.push_back(option.name);
  }
  // Note [Multi-process clients] (key_value.cpp)
  STRATA_CHECK(options.num_nodes >= 1 && options.node_id >= 0 && options.node_id < options.num_nodes, ConfigError,
               "[pjrt] node_id ", options.node_id, " of num_nodes ", options.num_nodes,
               ": need 0 <= node_id < num_nodes");
  if (options.num_nodes > 1) {
    STRATA_CHECK(supports_multi_process(kind), ConfigError, "[pjrt] the ", kind.empty() ? "unknown" : kind,
                 " plugin (", plugin->path(), ") makes one-process clients only, so it cannot span ",
                 options.num_nodes, " processes; run one process that drives several devices instead",
                 kind == "cpu" ? " (cpu_device_count=N)" : "");
    STRATA_CHECK(options.store != nullptr, ConfigError, "[pjrt] a client of ", options.num_nodes,
                 " processes needs a key-value store that all of them reach (ClientOptions::multi_process)");
    client.sent_.push_back({"node_id", static_cast<int64_t>(options.node_id)});
    client.sent_.push_back({"num_nodes", static_cast<int64_t>(options.num_nodes)});
  }
  std::vector<PJRT_NamedValue> values;
  for (const NamedValue& option : client.sent_) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = option.name.c_str();
    v.name_size = option.name.size();
    if (const auto* s = std::get_if<std::string>(&option.value)) {
      v.type = PJRT_NamedValue_kString;
      v.string_value = s->c_str();
      v.value_size = s->size();
    } else if (const auto* i = std::get_if<int64_t>(&option.value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *i;
      v.value_size = 1;
    } else if (const auto* l = std::get_if<std::vector<int64_t>>(&option.value)) {
      v.type = PJRT_NamedValue_kInt64List;
      v.int64_array_value = l->data();
      v.value_size = l->size();
    } else if (const auto* f = std::get_if<float>(&option.value)) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = *f;
      v.value_size = 1;
    } else {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = std::get<bool>(option.value);
      v.value_size = 1;
    }
    values.push_back(v);
  }
  auto args = STRATA_PJRT_ARGS(PJRT_Client_Create_Args);
  args.create_options = values.data();
  args.num_options = values.size();
  if (options.num_nodes > 1) attach_store(args, options.store.get());
  plugin->call(&PJRT_Api::PJRT_Client_Create, args, "PJRT_Client_Create");
  client.client_ = std::make_shared<detail::ClientHandle>();
  client.client_->plugin = std::move(plugin);
  client.client_->client = args.client;
  if (options.num_nodes > 1) client.client_->store = options.store;
  return client;
}

const Plugin& Client::plugin() const { return *client_->plugin; }

std::string Client::platform_name() const {
  auto args = STRATA_PJRT_ARGS(PJRT_Client_PlatformName_Args);
  args.client = client_->client;
  plugin().call(&PJRT_Api::PJRT_Client_PlatformName, args, "PJRT_Client_PlatformName");
  return text_of(args.platform_name, args.platform_name_size);
}

std::string Client::platform_version() const {
  auto args = STRATA_PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  args.client = client_->client;
  plugin().call(&PJRT_Api::PJRT_Client_PlatformVersion, args, "PJRT_Client_PlatformVersion");
  return text_of(args.platform_version, args.platform_version_size);
}

int Client::process_index() const {
  auto args = STRATA_PJRT_ARGS(PJRT_Client_ProcessIndex_Args);
  args.client = client_->client;
  plugin().call(&PJRT_Api::PJRT_Client_ProcessIndex, args, "PJRT_Client_ProcessIndex");
  return args.process_index;
}

std::vector<Device> Client::devices() const {
  auto args = STRATA_PJRT_ARGS(PJRT_Client_Devices_Args);
  args.client = client_->client;
  plugin().call(&PJRT_Api::PJRT_Client_Devices, args, "PJRT_Client_Devices");
  std::vector<Device> out;
  for (size_t i = 0; i < args.num_devices; ++i) out.push_back(describe(plugin(), args.devices[i]));
  return out;
}

std::vector<Device> Client::addressable_devices() const {
  auto args = STRATA_PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  args.client = client_->client;
  plugin().call(&PJRT_Api::PJRT_Client_AddressableDevices, args, "PJRT_Client_AddressableDevices");
  std::vector<Device> out;
  for (size_t i = 0; i < args.num_addressable_devices; ++i)
    out.push_back(describe(plugin(), args.addressable_devices[i]));
  return out;
}

Buffer Client::buffer_from_host(const void* data, size_t size, ElementType type,
                                const std::vector<int64_t>& dims, const Device& device) const {
  int64_t count = 1;
  for (int64_t d : dims) {
    STRATA_CHECK(d >= 0, ConfigError, "[pjrt] buffer_from_host: negative dimension ", d);
    count *= d;
  }
  STRATA_CHECK(static_cast<size_t>(count) * element_size(type) == size, ConfigError,
               "[pjrt] buffer_from_host: ", size, " bytes given for ", count, " elements of ",
               stablehlo_name(type), " (", static_cast<size_t>(count) * element_size(type),
               " bytes expected)");
  STRATA_CHECK(device.handle != nullptr, ConfigError, "[pjrt] buffer_from_host: no device given");
  auto args = STRATA_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = client_->client;
  args.data = data;
  args.type = static_cast<PJRT_Buffer_Type>(pjrt_buffer_type(type));
  args.dims = dims.data();
  args.num_dims = dims.size();
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  args.device = device.handle;
  plugin().call(&PJRT_Api::PJRT_Client_BufferFromHostBuffer, args, "PJRT_Client_BufferFromHostBuffer");
  Buffer buffer(client_, args.buffer);
  Event(client_->plugin, args.done_with_host_buffer).await("PJRT_Client_BufferFromHostBuffer (await)");
  return buffer;
}

LoadedExecutable Client::compile(const std::string& mlir_text, const CompileOptions& options) const {
  const std::string serialized = options.serialize();
  std::string code = mlir_text;  // PJRT_Program.code is not const
  const std::string format = "mlir";
  auto program = STRATA_PJRT_ARGS(PJRT_Program);
  program.code = code.data();
  program.code_size = code.size();
  program.format = format.c_str();
  program.format_size = format.size();
  auto args = STRATA_PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_->client;
  args.program = &program;
  args.compile_options = serialized.data();
  args.compile_options_size = serialized.size();
  plugin().call(&PJRT_Api::PJRT_Client_Compile, args, "PJRT_Client_Compile");
  return LoadedExecutable(client_, args.executable);
}

}  // namespace strata::xla
