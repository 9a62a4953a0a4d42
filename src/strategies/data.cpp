// process_dataloader: batches reach the device through a background
// prefetching DeviceLoader (the MpDeviceLoader role).
#include "strata/data/device_loader.h"
#include "strata/core/error.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {

std::shared_ptr<data::Loader> Strategy::process_dataloader(std::shared_ptr<data::Loader> loader) {
  STRATA_CHECK(loader != nullptr, ConfigError, "[", name(), "] process_dataloader got a null loader");
  // Each pass starts the next epoch (Lightning's loaders call set_epoch on
  // every iteration); an explicit set_epoch/load_state still decides.
  if (auto existing = std::dynamic_pointer_cast<data::DeviceLoader>(loader)) {
    existing->advance_epoch_each_pass(true);
    return loader;
  }
  if (loader->is_device_loader()) return loader;
  auto device_loader = std::make_shared<data::DeviceLoader>(std::move(loader), root_device());
  device_loader->advance_epoch_each_pass(true);
  loaders_.push_back(device_loader);
  return device_loader;
}

void Strategy::close_loaders() {
  for (const std::weak_ptr<data::Loader>& weak : loaders_) {
    if (auto loader = std::dynamic_pointer_cast<data::DeviceLoader>(weak.lock())) loader->close();
  }
  loaders_.clear();
}

}  // namespace strata::strategies
