// TorchFileWriter (checkpoint/torch_file.h): LibTorch's Pickler without
// type tags, and the zip records written tensor by tensor.
#include "strata/checkpoint/torch_file.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "strata/checkpoint/atomic.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::checkpoint {

c10::impl::GenericDict any_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }
c10::impl::GenericList any_list() { return c10::impl::GenericList(c10::AnyType::get()); }

at::Tensor TorchFileWriter::lazy_tensor(at::ScalarType dtype, const std::vector<int64_t>& shape,
                                        std::function<at::Tensor()> load) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // A storage of the right size with no allocation: the Pickler reads
  // only its size, dtype and device.
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(numel) * c10::elementSize(dtype),
                       at::DataPtr(nullptr, at::Device(at::kCPU)), /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(at::kCPU));
  t.set_(storage, 0, shape, c10::contiguous_strides(shape));
  sources_[storage.unsafeGetStorageImpl()] = Source{dtype, shape, std::move(load)};
  return t;
}

void TorchFileWriter::write(const std::string& path, const c10::IValue& value,
                            const std::function<void(const TorchFileProgress&)>& on_progress) const {
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.append(data, size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  // The Pickler numbers storages in the order it meets them: data/<i>.
  const std::vector<at::Tensor>& tensors = pickler.tensorData();
  TorchFileProgress progress;
  progress.tensors_total = tensors.size();
  for (const at::Tensor& t : tensors) progress.bytes_total += t.storage().nbytes();

  AtomicFile file(path);
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) -> size_t {
      file.write(data, size);
      return size;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeRecord(".format_version", "1", 1);
    writer.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto it = sources_.find(tensors[i].storage().unsafeGetStorageImpl());
      STRATA_CHECK(it != sources_.end(), CheckpointError, "[checkpoint] ", path,
                   ": the value holds a tensor that is not a lazy_tensor of this writer");
      const Source& source = it->second;
      at::Tensor data = source.load();
      STRATA_CHECK(data.defined() && data.scalar_type() == source.dtype && data.sizes().vec() == source.shape,
                   CheckpointError, "[checkpoint] ", path, ": tensor record ", i, " loaded as ",
                   data.defined() ? std::string(c10::toString(data.scalar_type())) : std::string("nothing"),
                   data.defined() ? shape_string(data.sizes().vec()) : std::string(), ", not the ",
                   c10::toString(source.dtype), shape_string(source.shape), " of its placeholder");
      data = data.to(at::kCPU).contiguous();
      writer.writeRecord("data/" + std::to_string(i), data.data_ptr(), data.nbytes());
      progress.tensors_done = i + 1;
      progress.bytes_done += data.nbytes();
      if (on_progress) on_progress(progress);
    }
    writer.writeEndOfFile();
  }
  file.commit();
}

}  // namespace strata::checkpoint
