// See gloo/context.h in this folder: strata's declarations for c10d's header.
#pragma once
#include "gloo/context.h"
