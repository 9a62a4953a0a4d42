// The xla strategy: DDP over the replicas' in-step collectives (Note
// [Ranks as threads] in strategies/xla.h).
#include "strata/strategies/xla.h"

#include "strata/core/error.h"

namespace strata::strategies {

namespace {

void check_xla(const Accelerator* accelerator, const char* strategy, const char* instead) {
  STRATA_CHECK(accelerator != nullptr && accelerator->name() == "xla", ConfigError, "[", strategy, "] the ",
               strategy, " strategy trains on xla devices, got accelerator '",
               accelerator ? accelerator->name() : std::string("null"), "'; use '", instead, "' on cpu or cuda");
}

}  // namespace

XlaStrategy::XlaStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision,
                         DDPOptions options)
    : DDPStrategy(accelerator, std::move(precision), std::move(options)) {
  check_xla(accelerator.get(), "xla", "ddp");
}

std::shared_ptr<Strategy> XlaStrategy::replica() const {
  return std::make_shared<XlaStrategy>(accelerator_, precision_, options());
}

XlaFSDPStrategy::XlaFSDPStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision,
                                 FSDPOptions options)
    : FSDPStrategy(accelerator, std::move(precision), std::move(options)) {
  check_xla(accelerator.get(), "xla_fsdp", "fsdp");
}

std::shared_ptr<Strategy> XlaFSDPStrategy::replica() const {
  return std::make_shared<XlaFSDPStrategy>(accelerator_, precision_, options());
}

}  // namespace strata::strategies
