// The error every failed PJRT call becomes.
//
// A plugin reports failure as a `PJRT_Error*` carrying a message and an
// absl::StatusCode. strata turns each into an XlaError whose message
// starts with the `[pjrt]` tag, names the call that failed, and carries the
// plugin's own message and code; the PJRT_Error is destroyed before the
// throw. XlaError derives from strata::Error, so main() reports it like any
// other strata error.
#pragma once

#include <string>
#include <string_view>

#include "strata/core/error.h"

namespace strata::xla {

/// A PJRT call failed, or a plugin could not be used.
class XlaError : public Error {
 public:
  /// `code` is the plugin's absl::StatusCode (0 when the error is strata's
  /// own, such as a plugin that cannot be opened).
  XlaError(const std::string& message, int code = 0) : Error(message), code_(code) {}

  /// The plugin's status code, 0 when strata raised the error itself.
  int code() const { return code_; }

 private:
  int code_;
};

/// The absl::StatusCode name of `code` ("INVALID_ARGUMENT"), or
/// "CODE_<n>" for a number outside the known range.
std::string status_code_name(int code);

}  // namespace strata::xla
