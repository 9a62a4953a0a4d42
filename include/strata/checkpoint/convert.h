// The checkpoint conversions (sharded.h: consolidate_checkpoint,
// reshard_checkpoint, export_module) with a report after each tensor they
// write, for the progress lines of `strata ckpt consolidate`, `reshard`
// and `export` on large checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "strata/checkpoint/sharded.h"

namespace strata::checkpoint {

/// What a conversion has written so far: tensor records (a sharded
/// tensor's slice in each rank file counts once per file) and their bytes,
/// of how many in all.
struct ConvertProgress {
  size_t tensors_done = 0;
  size_t tensors_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};
/// Called after each tensor record is written (on the calling thread).
using OnConvertProgress = std::function<void(const ConvertProgress&)>;

/// consolidate_checkpoint (sharded.h), calling `on_progress` after each tensor.
void consolidate_checkpoint(const StateReader& source, const std::string& out, const OnFileWritten& on_file,
                            const OnConvertProgress& on_progress);

/// reshard_checkpoint (sharded.h), calling `on_progress` after each slice
/// or whole tensor written to a rank file.
void reshard_checkpoint(const StateReader& source, const std::string& out, int world, const OnFileWritten& on_file,
                        const OnConvertProgress& on_progress);

/// export_module (sharded.h), calling `on_progress` after each tensor.
void export_module(const StateReader& source, const std::string& key, const std::string& out,
                   const std::vector<std::pair<std::string, std::string>>& aliases, const std::string& sub_prefix,
                   const OnConvertProgress& on_progress);

}  // namespace strata::checkpoint
