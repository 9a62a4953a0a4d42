// The PJRT key-value callbacks over a strata::xla::KeyValueStore (Note
// [Multi-process clients] in key_value.cpp). Private to src/xla/.
#pragma once

#include "pjrt_api.h"
#include "strata/xla/client.h"

namespace strata::xla {

/// Points `args`' get, try-get and put callbacks at `store`, which must
/// outlive the client.
void attach_store(PJRT_Client_Create_Args& args, KeyValueStore* store);

}  // namespace strata::xla
