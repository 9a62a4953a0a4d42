// The job's rendezvous store (strata/runtime/store.h) as the key-value
// store of a multi-process PJRT client (Note [Multi-process clients] in
// src/xla/key_value.cpp): what strata's workers hand
// ClientOptions::multi_process, so that the plugin's processes find each
// other through the store the launcher already set up.
#pragma once

#include <memory>

#include "strata/runtime/store.h"
#include "strata/xla/client.h"

namespace strata::xla {

/// `store` seen as a KeyValueStore, its keys under "pjrt/": get waits with
/// the store's wait (nullopt on its TimeoutError), set overwrites.
std::shared_ptr<KeyValueStore> rendezvous_key_values(std::shared_ptr<runtime::Store> store);

}  // namespace strata::xla
