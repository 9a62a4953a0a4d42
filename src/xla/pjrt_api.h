// The PJRT C API as strata's PJRT layer calls it: XLA's published header,
// vendored unmodified in third_party/pjrt/ (its README gives the version
// and source), and the one way strata fills an argument struct.
//
// PJRT plugins (XLA's CPU, CUDA and TPU runtimes) export one C symbol,
// `GetPjrtApi`, returning a table of function pointers. Every function takes
// one argument struct whose first two fields are `struct_size` and
// `extension_start`, and returns a `PJRT_Error*` (null on success).
//
// Private to the PJRT layer (src/xla/, and its tests): the public headers
// in include/strata/xla/ only forward-declare the opaque structs they
// mention, and Plugin::has/call, which need the table's layout, are defined
// in plugin_call.h beside this file.
#pragma once

#include <cstddef>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace strata::xla::pjrt {

/// The PJRT C API version of the header strata is built with.
inline constexpr int kApiMajor = PJRT_API_MAJOR;
inline constexpr int kApiMinor = PJRT_API_MINOR;

/// A slot of the PJRT_Api table whose function takes `Args`.
template <class Args>
using Fn = PJRT_Error* (*)(Args*);

/// A value-initialised argument struct whose struct_size is `size`: the
/// only way strata builds one (through STRATA_PJRT_ARGS), so that fields a
/// later header appends stay zero (Note [PJRT versions] in plugin.cpp).
template <class Args>
Args make_args(std::size_t size) {
  Args args{};
  args.struct_size = size;
  return args;
}

}  // namespace strata::xla::pjrt

/// make_args for the header's argument struct `T`, sized by the header's
/// `T_STRUCT_SIZE` (the end of its last field, not sizeof).
#define STRATA_PJRT_ARGS(T) ::strata::xla::pjrt::make_args<T>(T##_STRUCT_SIZE)
