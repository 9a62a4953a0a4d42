// make_strategy and the parsing of the strategies' enums.
#include "strata/strategies/make_strategy.h"

#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/strategies/single_device.h"

namespace strata::strategies {

StrategyKind parse_strategy_kind(const std::string& name) {
  if (name == "auto") return StrategyKind::kAuto;
  if (name == "single_device") return StrategyKind::kSingleDevice;
  if (name == "ddp") return StrategyKind::kDDP;
  if (name == "fsdp") return StrategyKind::kFSDP;
  if (name == "xla" || name == "xla_fsdp") {
    throw ConfigError("[strategy] '" + name +
                      "' needs the XLA accelerator, which strata does not support yet; use '" +
                      (name == "xla" ? "ddp" : "fsdp") + "' for the same strategy on cpu or cuda");
  }
  throw ConfigError("[strategy] unknown strategy '" + name + "'; choose one of: auto, ddp, fsdp, single_device");
}

const char* to_string(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kAuto: return "auto";
    case StrategyKind::kSingleDevice: return "single_device";
    case StrategyKind::kDDP: return "ddp";
    case StrategyKind::kFSDP: return "fsdp";
  }
  return "?";
}

StateDictType parse_state_dict_type(const std::string& name) {
  if (name == "sharded") return StateDictType::kSharded;
  if (name == "full") return StateDictType::kFull;
  throw ConfigError("[fsdp] state_dict_type must be 'full' or 'sharded', got '" + name + "'");
}

const char* to_string(StateDictType type) { return type == StateDictType::kFull ? "full" : "sharded"; }

std::shared_ptr<Strategy> make_strategy(const StrategyOptions& options) {
  std::shared_ptr<Accelerator> accelerator = options.accelerator ? options.accelerator : cpu_accelerator();
  const bool replicated_or_sharded =
      options.kind == StrategyKind::kDDP || options.kind == StrategyKind::kFSDP ||
      (options.kind == StrategyKind::kAuto && options.world_size > 1);
  STRATA_CHECK(accelerator->name() != "xla" || !replicated_or_sharded, ConfigError,
               "[strategy] '", options.kind == StrategyKind::kFSDP ? "fsdp" : "ddp",
               "' runs on cpu and cuda; on accelerator 'xla' train with 'single_device' (or 'auto') on one device "
               "(the xla and xla_fsdp strategies are not built yet)");
  switch (options.kind) {
    case StrategyKind::kDDP:
      return std::make_shared<DDPStrategy>(std::move(accelerator), options.precision, options.ddp);
    case StrategyKind::kFSDP:
      return std::make_shared<FSDPStrategy>(std::move(accelerator), options.precision, options.fsdp);
    case StrategyKind::kAuto:
      if (options.world_size > 1) {
        return std::make_shared<DDPStrategy>(std::move(accelerator), options.precision, options.ddp);
      }
      [[fallthrough]];
    case StrategyKind::kSingleDevice:
      return std::make_shared<SingleDeviceStrategy>(std::move(accelerator), options.precision);
  }
  throw ConfigError("[strategy] unknown strategy kind");
}

std::shared_ptr<Strategy> make_strategy(const std::string& name, std::shared_ptr<Accelerator> accelerator,
                                        const Precision& precision, int world_size) {
  return make_strategy(StrategyOptions()
                           .with_kind(name)
                           .with_accelerator(std::move(accelerator))
                           .with_precision(precision)
                           .with_world_size(world_size));
}

std::shared_ptr<Strategy> resolve_strategy(const StrategyChoice& choice, std::shared_ptr<Accelerator> accelerator,
                                           const std::optional<std::string>& precision, int world_size,
                                           const std::string& who) {
  std::optional<Precision> parsed;
  if (precision) parsed = Precision::parse(*precision, accelerator->name());
  if (const auto* object = std::get_if<std::shared_ptr<Strategy>>(&choice)) {
    STRATA_CHECK(*object != nullptr, ConfigError, "[", who, "] with_strategy got a null strategy object");
    if (parsed) (*object)->set_precision(*parsed);
    return *object;
  }
  return make_strategy(StrategyOptions()
                           .with_kind(std::get<std::string>(choice))
                           .with_accelerator(accelerator)
                           .with_precision(parsed.value_or(Precision::parse("32-true", accelerator->name())))
                           .with_world_size(world_size));
}

}  // namespace strata::strategies
