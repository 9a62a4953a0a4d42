// Building a strategy from options: what Fabric and the command line do
// with a strategy name, in one place.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/options.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {

/// Everything make_strategy needs. Fluent setters.
struct StrategyOptions {
  StrategyKind kind = StrategyKind::kAuto;
  /// Null: the CPU.
  std::shared_ptr<Accelerator> accelerator;
  /// Nullopt: "32-true".
  std::optional<Precision> precision;
  /// Workers in the job (decides what kAuto means).
  int world_size = 1;
  /// Options of the strategy built, when it is DDP or FSDP.
  DDPOptions ddp;
  FSDPOptions fsdp;

  StrategyOptions& with_kind(StrategyKind k) { kind = k; return *this; }
  /// Parses the name (parse_strategy_kind).
  StrategyOptions& with_kind(const std::string& name) { kind = parse_strategy_kind(name); return *this; }
  StrategyOptions& with_accelerator(std::shared_ptr<Accelerator> a) { accelerator = std::move(a); return *this; }
  StrategyOptions& with_precision(Precision p) { precision = std::move(p); return *this; }
  StrategyOptions& with_world_size(int w) { world_size = w; return *this; }
  StrategyOptions& with_ddp(DDPOptions o) { ddp = std::move(o); return *this; }
  StrategyOptions& with_fsdp(FSDPOptions o) { fsdp = std::move(o); return *this; }
};

/// Builds the strategy `options` describe.
std::shared_ptr<Strategy> make_strategy(const StrategyOptions& options);

/// Builds a strategy from its name: "ddp", "fsdp", "single_device", "auto"
/// (ddp for several devices, single_device for one), with default options;
/// "xla" and "xla_fsdp" are refused until the XLA accelerator exists.
std::shared_ptr<Strategy> make_strategy(const std::string& name, std::shared_ptr<Accelerator> accelerator,
                                        const Precision& precision, int world_size);

/// The strategy a choice means. A name is built by make_strategy with
/// `precision` (unset: "32-true"); an object is used as it is, and a set
/// `precision` replaces its own (Lightning's rule). `who` ("fabric",
/// "trainer") starts the messages; a null object is a ConfigError.
std::shared_ptr<Strategy> resolve_strategy(const StrategyChoice& choice, std::shared_ptr<Accelerator> accelerator,
                                           const std::optional<std::string>& precision, int world_size,
                                           const std::string& who);

}  // namespace strata::strategies
