// Choices shared by the strategies and their makers, as enums. Strings
// (command-line flags, user options) are parsed at the edge by the
// parse_* functions, which name the accepted values in their errors.
#pragma once

#include <string>

namespace strata::strategies {

/// Which strategy to build.
enum class StrategyKind {
  kAuto,          ///< ddp for several devices, single_device for one
  kSingleDevice,  ///< "single_device"
  kDDP,           ///< "ddp": data parallel on cpu and cuda workers
  kFSDP,          ///< "fsdp": fully sharded on cpu and cuda workers
  kXla,           ///< "xla" (Lightning's XLAStrategy): data parallel on xla devices
  kXlaFSDP,       ///< "xla_fsdp" (Lightning's XLAFSDPStrategy): fully sharded on xla devices
};

/// Parses "auto", "single_device", "ddp", "fsdp", "xla", "xla_fsdp";
/// anything else is a ConfigError listing the choices.
StrategyKind parse_strategy_kind(const std::string& name);
/// The name parse_strategy_kind accepts.
const char* to_string(StrategyKind kind);

/// How a sharded strategy saves checkpoints.
enum class StateDictType {
  kSharded,  ///< one file per rank plus metadata (Lightning's default)
  kFull,     ///< one consolidated file written by rank 0
};

/// Parses "full" and "sharded"; ConfigError otherwise.
StateDictType parse_state_dict_type(const std::string& name);
/// "full" or "sharded".
const char* to_string(StateDictType type);

}  // namespace strata::strategies
