// Loading a PJRT plugin: the shared library of an XLA runtime (CPU, CUDA,
// TPU) that exports `GetPjrtApi`.
//
// Plugin::load opens the library once per path and keeps it for the life
// of the process (plugins register exit handlers, Note [Never unload] in
// plugin.cpp), checks the API version, initialises the plugin and reads its
// attributes. Every call into the plugin goes through Plugin::call, which
// checks that the plugin's table has the slot and turns a returned
// PJRT_Error into an XlaError. Nothing here depends on LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "strata/xla/error.h"

// PJRT's structs, opaque here: XLA's header that defines them
// (third_party/pjrt/) is private to the PJRT layer.
struct PJRT_Api;
struct PJRT_Error;

namespace strata::xla {

/// A plugin attribute or a client-creation option.
struct NamedValue {
  using Value = std::variant<std::string, int64_t, std::vector<int64_t>, float, bool>;
  std::string name;
  Value value;
};

/// `value` as text: strings as they are, lists as "[1, 2]", bools as
/// true/false.
std::string value_text(const NamedValue::Value& value);

/// A PJRT C API version.
struct ApiVersion {
  int major = 0;
  int minor = 0;
};

/// The PJRT C API version of the header strata is built with.
ApiVersion strata_api_version();

/// Throws XlaError unless a plugin at `plugin` can be used by strata:
/// major 0 and minor >= strata_api_version().minor. The message names the
/// plugin `path` and both versions.
void check_api_version(ApiVersion plugin, const std::string& path);

/// The plugin path to use: `option` when non-empty, else the environment
/// variable STRATA_PJRT_PLUGIN. Throws ConfigError naming both when
/// neither is set.
std::string plugin_path_from(const std::string& option);

/// An opened, version-checked, initialised PJRT plugin. Shared and
/// immutable; never unloaded.
class Plugin {
 public:
  /// Opens the plugin at `path` (once per process and path: later calls
  /// return the same object). Throws XlaError when the file cannot be
  /// opened, has no `GetPjrtApi`, has an unusable version, or fails to
  /// initialise.
  static std::shared_ptr<const Plugin> load(const std::string& path);

  const std::string& path() const { return path_; }
  ApiVersion version() const { return version_; }
  /// The attributes the plugin reports (xla_version, stablehlo versions,
  /// ...), in the plugin's order; empty for plugins without the call.
  const std::vector<NamedValue>& attributes() const { return attributes_; }
  /// The function table. Prefer call().
  const PJRT_Api& api() const { return *api_; }

  /// Whether the plugin's table is long enough to hold `slot` and the slot
  /// is set. Defined in src/xla/plugin_call.h, for the PJRT layer's own
  /// sources (a slot names a member of the private PJRT_Api).
  template <class Fn>
  bool has(Fn PJRT_Api::*slot) const;

  /// Calls `slot` with `args`; throws XlaError naming `what` when the slot
  /// is missing or the call returns an error. Defined in
  /// src/xla/plugin_call.h, as has().
  template <class Args>
  void call(PJRT_Error* (*PJRT_Api::*slot)(Args*), Args& args, std::string_view what) const;

  /// Throws XlaError("[pjrt] <what> failed: <message>", code) when `error`
  /// is non-null, destroying it first.
  void check(PJRT_Error* error, std::string_view what) const;

 private:
  Plugin(std::string path, const PJRT_Api* api);
  bool slot_present(ptrdiff_t offset, size_t size) const;
  [[noreturn]] void throw_missing(std::string_view what) const;

  std::string path_;
  const PJRT_Api* api_;
  ApiVersion version_;
  std::vector<NamedValue> attributes_;
};

}  // namespace strata::xla
