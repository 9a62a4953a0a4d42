// The umbrella header: strata's whole public API.
#pragma once

#include "strata/comm/backend.h"
#include "strata/comm/group.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/store.h"
