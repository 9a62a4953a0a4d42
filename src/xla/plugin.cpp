// Opening PJRT plugins, checking their version, and turning their errors
// into XlaError.
#include "strata/xla/plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "pjrt_api.h"
#include "plugin_call.h"

namespace strata::xla {
namespace {

// Note [PJRT versions]
// The PJRT C API is versioned major.minor. Within major 0 a minor bump
// appends fields to argument structs and slots to the function table, and
// each side reads `struct_size` to see how much of a struct the other knows,
// so a plugin newer than the header strata is built with (pjrt_api.h) is
// fine. Two things are not: a different major, and a plugin older than the
// header (it may lack fields or slots strata uses; 0.57 even rearranged the
// table without a major bump). So strata requires major 0 and minor >= the
// header's, and refuses anything else before calling a single function.

// Note [Never unload]
// Plugins register atexit handlers and thread-local destructors that point
// into the library; a process that dlclose()s one dies at exit. A loaded
// plugin therefore stays mapped until the process ends: the handle from
// dlopen is dropped on purpose, and the registry below keeps one Plugin per
// path so that loading twice costs nothing and never opens a second copy.

std::mutex registry_mutex;
std::map<std::string, std::shared_ptr<const Plugin>>& registry() {
  static auto* plugins = new std::map<std::string, std::shared_ptr<const Plugin>>();
  return *plugins;
}

NamedValue::Value read_value(const PJRT_NamedValue& v) {
  switch (v.type) {
    case PJRT_NamedValue_kString:
      return std::string(v.string_value, v.value_size);
    case PJRT_NamedValue_kInt64:
      return v.int64_value;
    case PJRT_NamedValue_kInt64List:
      return std::vector<int64_t>(v.int64_array_value, v.int64_array_value + v.value_size);
    case PJRT_NamedValue_kFloat:
      return v.float_value;
    case PJRT_NamedValue_kBool:
      return v.bool_value;
  }
  return std::string("<unknown type ") + std::to_string(static_cast<int>(v.type)) + ">";
}

}  // namespace

std::string status_code_name(int code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return kNames[code];
  return "CODE_" + std::to_string(code);
}

std::string value_text(const NamedValue::Value& value) {
  struct Visitor {
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    }
    std::string operator()(float v) const {
      std::ostringstream out;
      out << v;
      return out.str();
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
  };
  return std::visit(Visitor{}, value);
}

ApiVersion strata_api_version() { return {pjrt::kApiMajor, pjrt::kApiMinor}; }

void check_api_version(ApiVersion plugin, const std::string& path) {
  const ApiVersion ours = strata_api_version();
  const std::string versions =
      strata::detail::cat("the plugin has PJRT C API ", plugin.major, ".", plugin.minor,
                          ", strata was written against ", ours.major, ".", ours.minor);
  if (plugin.major != ours.major)
    throw XlaError(strata::detail::cat("[pjrt] ", path, ": unsupported PJRT C API major version: ", versions,
                                       ". Use a plugin with major version ", ours.major, "."));
  if (plugin.minor < ours.minor)
    throw XlaError(strata::detail::cat("[pjrt] ", path, ": plugin too old: ", versions, " and needs ",
                                       ours.major, ".", ours.minor, " or newer. Install a newer plugin."));
}

std::string plugin_path_from(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("STRATA_PJRT_PLUGIN");
  if (env != nullptr && *env != '\0') return env;
  throw ConfigError(
      "[pjrt] no PJRT plugin given: pass --plugin PATH or set STRATA_PJRT_PLUGIN to the plugin's "
      "shared library (e.g. jax_plugins/xla_cuda13/xla_cuda_plugin.so, or "
      "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so for the CPU)");
}

std::shared_ptr<const Plugin> Plugin::load(const std::string& path) {
  STRATA_CHECK(!path.empty(), ConfigError, "[pjrt] the plugin path is empty");
  STRATA_CHECK(path.size() < 4096, ConfigError, "[pjrt] the plugin path is ", path.size(),
               " bytes long; give a path under 4096 bytes");
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto found = registry().find(path);
  if (found != registry().end()) return found->second;

  // RTLD_LOCAL: a plugin carries its own copy of LLVM, absl and protobuf,
  // which must not bind to anyone else's symbols (nor theirs to ours).
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw XlaError(strata::detail::cat(
        "[pjrt] cannot open the PJRT plugin ", path, ": ", why != nullptr ? why : "unknown dlopen error",
        ". Check the path (--plugin or STRATA_PJRT_PLUGIN) and that the libraries it "
        "needs are on LD_LIBRARY_PATH"));
  }
  auto get_api = reinterpret_cast<const PJRT_Api* (*)()>(::dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr)
    throw XlaError(
        strata::detail::cat("[pjrt] ", path, " is not a PJRT plugin: it does not export GetPjrtApi"));
  const PJRT_Api* api = get_api();
  if (api == nullptr) throw XlaError(strata::detail::cat("[pjrt] ", path, ": GetPjrtApi() returned null"));
  // Note [Never unload]: `handle` is intentionally never passed to dlclose.
  std::shared_ptr<const Plugin> plugin(new Plugin(path, api));
  registry().emplace(path, plugin);
  return plugin;
}

Plugin::Plugin(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {
  // The version struct sits at a fixed place in every version of the table.
  const size_t version_end = offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version);
  if (api_->struct_size < version_end)
    throw XlaError(strata::detail::cat("[pjrt] ", path_, ": the PJRT_Api table is ", api_->struct_size,
                                       " bytes, too small to hold a version; this is not a usable plugin"));
  version_ = {api_->pjrt_api_version.major_version, api_->pjrt_api_version.minor_version};
  check_api_version(version_, path_);

  if (has(&PJRT_Api::PJRT_Plugin_Initialize)) {
    auto args = STRATA_PJRT_ARGS(PJRT_Plugin_Initialize_Args);
    call(&PJRT_Api::PJRT_Plugin_Initialize, args, "PJRT_Plugin_Initialize");
  }
  if (has(&PJRT_Api::PJRT_Plugin_Attributes)) {
    auto args = STRATA_PJRT_ARGS(PJRT_Plugin_Attributes_Args);
    call(&PJRT_Api::PJRT_Plugin_Attributes, args, "PJRT_Plugin_Attributes");
    STRATA_CHECK(args.num_attributes < 4096, xla::XlaError, "[pjrt] ", path_, " reports ",
                 args.num_attributes, " attributes; refusing more than 4096");
    for (size_t i = 0; i < args.num_attributes; ++i) {
      const PJRT_NamedValue& v = args.attributes[i];
      attributes_.push_back({std::string(v.name, v.name_size), read_value(v)});
    }
  }
}

bool Plugin::slot_present(ptrdiff_t offset, size_t size) const {
  return offset >= 0 && static_cast<size_t>(offset) + size <= api_->struct_size;
}

void Plugin::throw_missing(std::string_view what) const {
  throw XlaError(strata::detail::cat("[pjrt] ", path_, " (PJRT C API ", version_.major, ".", version_.minor,
                                     ") does not provide ", what));
}

void Plugin::check(PJRT_Error* error, std::string_view what) const {
  if (error == nullptr) return;
  std::string message = "(no message)";
  int code = PJRT_Error_Code_UNKNOWN;
  if (api_->PJRT_Error_Message != nullptr) {
    auto args = STRATA_PJRT_ARGS(PJRT_Error_Message_Args);
    args.error = error;
    api_->PJRT_Error_Message(&args);
    if (args.message != nullptr) message.assign(args.message, args.message_size);
  }
  if (api_->PJRT_Error_GetCode != nullptr) {
    auto args = STRATA_PJRT_ARGS(PJRT_Error_GetCode_Args);
    args.error = error;
    if (api_->PJRT_Error_GetCode(&args) == nullptr) code = args.code;
  }
  if (api_->PJRT_Error_Destroy != nullptr) {
    auto args = STRATA_PJRT_ARGS(PJRT_Error_Destroy_Args);
    args.error = error;
    api_->PJRT_Error_Destroy(&args);
  }
  throw XlaError(strata::detail::cat("[pjrt] ", what, " failed (", status_code_name(code), "): ", message),
                 code);
}

}  // namespace strata::xla
