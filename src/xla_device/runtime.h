// The process-wide state of the xla device, shared by its sources: the
// PJRT client, the current device of each thread, the generators, and the
// counters behind strata::xla::metrics().
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <string>

#include "strata/xla/client.h"

namespace strata::xla::detail {

/// The client made by init(); throws XlaError before init().
const Client& client();
/// The client's addressable device `index`; throws ConfigError when out
/// of range.
const Device& pjrt_device(int index);
int addressable_device_count();

/// This thread's current xla device (the device guard's).
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

/// The default generator of xla:`index` (-1: the current device).
/// Note [Generators on the host]: a CPU generator, since the random ops run
/// through the CPU fallback.
const at::Generator& default_generator(c10::DeviceIndex index);

void count_upload(size_t bytes);
void count_download(size_t bytes);
/// Counts a fallback of `op`; true on its first one in this process.
bool count_fallback(const std::string& op);

/// Registers the aten kernels and the fallback on PrivateUse1 (kernels.cpp).
void register_kernels();

}  // namespace strata::xla::detail
