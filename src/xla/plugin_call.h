// Plugin::has and Plugin::call (declared in include/strata/xla/plugin.h):
// they read the PJRT function table, whose layout only the PJRT layer's
// header (pjrt_api.h) knows. Private to src/xla/.
#pragma once

#include <string_view>

#include "pjrt_api.h"
#include "strata/xla/plugin.h"

namespace strata::xla {

template <class Fn>
bool Plugin::has(Fn PJRT_Api::*slot) const {
  return slot_present(reinterpret_cast<const char*>(&(api_->*slot)) - reinterpret_cast<const char*>(api_),
                      sizeof(Fn)) &&
         api_->*slot != nullptr;
}

template <class Args>
void Plugin::call(pjrt::Fn<Args> PJRT_Api::*slot, Args& args, std::string_view what) const {
  if (!has(slot)) throw_missing(what);
  check((api_->*slot)(&args), what);
}

}  // namespace strata::xla
