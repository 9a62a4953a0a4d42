// A multi-process PJRT client's key-value store on the rendezvous store
// (include/strata/xla_device/rendezvous.h).
#include "strata/xla_device/rendezvous.h"

#include "strata/core/error.h"

namespace strata::xla {
namespace {

class RendezvousKeyValues final : public KeyValueStore {
 public:
  explicit RendezvousKeyValues(std::shared_ptr<runtime::Store> store)
      : store_(runtime::prefix_store(std::move(store), "pjrt")) {}

  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    if (!store_->check({key})) {
      if (timeout.count() <= 0) return std::nullopt;
      try {
        store_->wait({key}, timeout);
      } catch (const TimeoutError&) {
        return std::nullopt;  // the plugin reports DEADLINE_EXCEEDED with the key
      }
    }
    return store_->get(key);
  }

  void set(const std::string& key, const std::string& value) override { store_->set(key, value); }

 private:
  std::shared_ptr<runtime::Store> store_;
};

}  // namespace

std::shared_ptr<KeyValueStore> rendezvous_key_values(std::shared_ptr<runtime::Store> store) {
  STRATA_CHECK(store != nullptr, ConfigError, "[xla] rendezvous_key_values needs a store");
  return std::make_shared<RendezvousKeyValues>(std::move(store));
}

}  // namespace strata::xla
