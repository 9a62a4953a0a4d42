// The one-rank backend: every collective is the identity, so a single
// process runs every strategy without a launcher.
#pragma once

#include <memory>

#include "strata/comm/backend.h"

namespace strata::comm::local {

/// Always true.
inline bool is_available() { return true; }

/// A backend of one rank (rank 0, size 1).
std::shared_ptr<Backend> create();

}  // namespace strata::comm::local
