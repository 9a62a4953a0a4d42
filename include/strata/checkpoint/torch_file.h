// Files in torch.save's format that torch.load(..., weights_only=True)
// reads: a zip archive holding data.pkl (the pickled value) and one record
// per tensor storage (data/0, data/1, ...), written with LibTorch's own
// Pickler and PyTorchStreamWriter.
//
// Note [Pickling for weights_only]
// torch::pickle_save tags every dict with torch.jit._pickle.restore_type_tag
// and pickles lists of ints, floats, bools or tensors through
// torch.jit._pickle.build_*list, globals that torch.load's weights_only
// unpickler refuses. TorchFileWriter pickles with type tags off and expects
// lists and dicts of element type Any (c10::impl::GenericList/GenericDict
// built with c10::AnyType), so the pickle holds only what weights_only
// allows: dicts, lists, tuples, str, int, float, bool, None and tensors
// (torch._utils._rebuild_tensor_v2 over typed storages).
//
// Tensors are lazy: the value holds placeholders (lazy_tensor) with a dtype
// and a shape but no data, and each one's bytes are loaded when its record
// is written, so a checkpoint larger than memory is written holding one
// tensor at a time.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata::checkpoint {

/// Progress of TorchFileWriter::write: tensors and bytes written so far, of
/// how many.
struct TorchFileProgress {
  size_t tensors_done = 0;
  size_t tensors_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

class TorchFileWriter {
 public:
  /// A CPU tensor of `dtype` and `shape` (contiguous) that holds no data:
  /// put it in the value given to write(); `load` gives its contents when
  /// its record is written (a CPU tensor of that dtype and shape). The
  /// same placeholder in several places is one storage in the file (as a
  /// tied weight in torch.save).
  at::Tensor lazy_tensor(at::ScalarType dtype, const std::vector<int64_t>& shape, std::function<at::Tensor()> load);

  /// Pickles `value` (Note [Pickling for weights_only]) and writes the file
  /// to `path` atomically (checkpoint/atomic.h: a temporary file renamed
  /// into place; an existing file there is replaced); the archive's top
  /// folder is "archive" (torch.save names it after the file; torch.load
  /// takes any). `on_progress` is called after each tensor record. Throws
  /// CheckpointError when a loaded tensor's dtype or shape differs from its
  /// placeholder's, when the value holds a tensor that is not a placeholder,
  /// or when the file cannot be written (naming the path).
  void write(const std::string& path, const c10::IValue& value,
             const std::function<void(const TorchFileProgress&)>& on_progress = {}) const;

 private:
  struct Source {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    std::function<at::Tensor()> load;
  };
  std::unordered_map<const void*, Source> sources_;  // by StorageImpl
};

/// A dict of type Dict[Any, Any], for TorchFileWriter values.
c10::impl::GenericDict any_dict();
/// A list of type List[Any], for TorchFileWriter values.
c10::impl::GenericList any_list();

}  // namespace strata::checkpoint
