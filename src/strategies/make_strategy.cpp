// make_strategy and the parsing of the strategies' enums.
#include "strata/strategies/make_strategy.h"

#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/strategies/single_device.h"
#include "strata/strategies/xla.h"

namespace strata::strategies {

StrategyKind parse_strategy_kind(const std::string& name) {
  if (name == "auto") return StrategyKind::kAuto;
  if (name == "single_device") return StrategyKind::kSingleDevice;
  if (name == "ddp") return StrategyKind::kDDP;
  if (name == "fsdp") return StrategyKind::kFSDP;
  if (name == "xla") return StrategyKind::kXla;
  if (name == "xla_fsdp") return StrategyKind::kXlaFSDP;
  throw ConfigError("[strategy] unknown strategy '" + name +
                    "'; choose one of: auto, ddp, fsdp, single_device, xla, xla_fsdp");
}

const char* to_string(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kAuto: return "auto";
    case StrategyKind::kSingleDevice: return "single_device";
    case StrategyKind::kDDP: return "ddp";
    case StrategyKind::kFSDP: return "fsdp";
    case StrategyKind::kXla: return "xla";
    case StrategyKind::kXlaFSDP: return "xla_fsdp";
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
  const bool on_xla = accelerator->name() == "xla";
  STRATA_CHECK(!on_xla || (options.kind != StrategyKind::kDDP && options.kind != StrategyKind::kFSDP), ConfigError,
               "[strategy] '", to_string(options.kind), "' runs on cpu and cuda; on accelerator 'xla' use '",
               options.kind == StrategyKind::kDDP ? "xla" : "xla_fsdp", "' (the seeds' name for it there)");
  const bool xla_kind = options.kind == StrategyKind::kXla || options.kind == StrategyKind::kXlaFSDP;
  STRATA_CHECK(on_xla || !xla_kind, ConfigError, "[strategy] '", to_string(options.kind),
               "' trains on xla devices; on accelerator '", accelerator->name(), "' use '",
               options.kind == StrategyKind::kXla ? "ddp" : "fsdp", "' (or accelerator 'xla')");
  switch (options.kind) {
    case StrategyKind::kDDP:
      return std::make_shared<DDPStrategy>(std::move(accelerator), options.precision, options.ddp);
    case StrategyKind::kFSDP:
      return std::make_shared<FSDPStrategy>(std::move(accelerator), options.precision, options.fsdp);
    case StrategyKind::kXla:
      return std::make_shared<XlaStrategy>(std::move(accelerator), options.precision, options.ddp);
    case StrategyKind::kXlaFSDP:
      return std::make_shared<XlaFSDPStrategy>(std::move(accelerator), options.precision, options.fsdp);
    case StrategyKind::kAuto:
      if (options.world_size > 1 && on_xla)
        return std::make_shared<XlaStrategy>(std::move(accelerator), options.precision, options.ddp);
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
