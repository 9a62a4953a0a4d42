// Precompiled header for every strata target: the LibTorch headers that
// cost ~20 s to parse in each translation unit, parsed once per build.
// Sources still include the narrow headers they need; with this header
// precompiled those includes are free.
#pragma once

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
