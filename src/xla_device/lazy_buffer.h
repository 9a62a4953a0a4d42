// The bytes of one xla storage: a LazyBuffer, held by the storage's DataPtr
// as its context, and the helpers that read and write tensors through it.
//
// Note [Storage-backed xla tensors]
// A tensor on the xla device is an ordinary TensorImpl over an ordinary
// StorageImpl; only the DataPtr is special. Its data pointer is the
// LazyBuffer's own address (unique and non-null, never dereferenced: no
// kernel runs on xla memory) and its context is the same LazyBuffer, which
// holds the storage's value. Views share the StorageImpl, so they resolve
// against their base's LazyBuffer with their own sizes, strides and offset.
// XLA buffers are immutable: a write builds the storage's new bytes and
// rebinds the LazyBuffer to a new PJRT buffer; the old one is released.
// The value is one of:
//   - Unwritten: allocated, never written (reads see zeros);
//   - OnDevice: a PJRT buffer, plus the host copy of its bytes while one is
//     kept (a download or the upload that made it; mark_step releases it);
//   - Pending: a node of the step being recorded (lazy_graph.h), the
//     storage's whole contents as a 1-d value of its element type. A lowered
//     kernel (lowerings.cpp) rebinds its output's storage to one; mark_step
//     runs every live pending value in one program and rebinds each storage
//     to its result buffer (Note [One program per step] in recorder.cpp).
//     Whatever needs the bytes of a pending storage (a read on the host, a
//     write to part of it, a resize) syncs the whole step first.
// A mutex guards the value: autograd's device thread runs kernels too.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <variant>
#include <vector>

#include "strata/xla/client.h"
#include "strata/xla/lazy_graph.h"

namespace strata::xla::detail {

using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

/// The value of one xla storage.
class LazyBuffer {
 public:
  LazyBuffer(size_t nbytes, int device_index);
  ~LazyBuffer();
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;

  size_t nbytes() const;
  int device_index() const { return device_index_; }

  /// The storage's bytes on the host: the kept host copy, else a download
  /// (kept until mark_step), zeros when never written.
  Bytes host_bytes() const;

  /// Rebinds the storage to `bytes` (exactly nbytes() of them), uploaded
  /// to the device as a 1-d buffer of `type` (bytes when the size does not
  /// divide). The host copy is kept.
  void assign(Bytes bytes, ElementType type);

  /// Rebinds the storage to its current bytes (zeros when `overwrite`:
  /// `change` writes all of them) changed by `change`, under the buffer's
  /// lock, so that writes to two views of one storage from two threads do
  /// not lose either.
  void update(const std::function<void(std::vector<uint8_t>&)>& change, ElementType type, bool overwrite);

  /// Grows the storage to `nbytes`, keeping its bytes (the rest zeros).
  void grow(size_t nbytes);

  /// Drops the host copy of a value that is on the device.
  void release_host_copy();

  /// Whether the value is a PJRT buffer (false: never written or pending).
  bool on_device() const;

  /// Whether the value is a pending node of the step being recorded.
  bool pending() const;

  /// The storage's whole value as a graph node of type {`type`, {nbytes /
  /// element size}}: the pending node, a parameter over the device buffer,
  /// or zeros when never written. Null when the storage does not hold
  /// `type` elements (its buffer has another element type, or the size
  /// does not divide), so the caller falls back.
  lazy::NodePtr value_node(ElementType type) const;

  /// Rebinds the storage to the pending `node` (of value_node's type).
  void set_pending(lazy::NodePtr node);

  /// Binds the storage to change(its current value as `type`), atomically
  /// with respect to other writes (Note [Writes into a view] in
  /// lowering.h). False, changing nothing, when the value cannot be read as
  /// `type` or `change` returns nullptr.
  bool rewrite(ElementType type, const std::function<lazy::NodePtr(const lazy::NodePtr&)>& change);

  /// The pending node, null when the value is not pending.
  lazy::NodePtr pending_node() const;

  /// Rebinds the storage to `result`, the buffer computed for `node`, if
  /// the storage still holds `node` (a kernel on another thread may have
  /// written it since). True when it did.
  bool bind_result(const lazy::NodePtr& node, std::shared_ptr<const Buffer> result);

  /// The storage's creation number: the order in which mark_step returns
  /// the pending values (Note [One program per step] in recorder.cpp).
  uint64_t serial() const { return serial_; }

 private:
  struct Unwritten {};
  struct OnDevice {
    std::shared_ptr<const Buffer> buffer;
    stablehlo::Type type;           // the buffer's, 1-d
    mutable Bytes host;             // empty once released
    mutable lazy::NodePtr node;     // the buffer as a graph parameter, made on first use
  };
  struct Pending {
    lazy::NodePtr node;
  };
  void assign_locked(Bytes bytes, ElementType type);
  lazy::NodePtr value_node_locked(ElementType type) const;
  std::vector<uint8_t> bytes_locked() const;

  mutable std::mutex mutex_;
  size_t nbytes_;
  const int device_index_;
  const uint64_t serial_;
  std::variant<Unwritten, OnDevice, Pending> value_;
};

/// A pending value of a live storage, for mark_step.
struct PendingValue {
  LazyBuffer* buffer;
  lazy::NodePtr node;
  int device_index;
};

/// The pending values of every live storage, by serial().
std::vector<PendingValue> pending_values();

/// Rebinds each storage still alive and still holding its node to its
/// result buffer; returns how many were rebound.
size_t bind_results(const std::vector<PendingValue>& values,
                    const std::vector<std::shared_ptr<const Buffer>>& results);

/// The allocator of xla storages (c10::GetAllocator(PrivateUse1)).
c10::Allocator* allocator();

/// The LazyBuffer behind an xla tensor's storage; throws XlaError when the
/// storage was not made by allocator().
LazyBuffer& lazy_buffer(const c10::StorageImpl& storage);
LazyBuffer& lazy_buffer(const at::Tensor& tensor);

/// A CPU tensor with `xla`'s dtype, sizes, strides and offset over a host
/// copy of its storage (read-only by contract: it may share the kept copy).
at::Tensor host_view(const at::Tensor& xla);

/// Writes `src` (a CPU tensor, broadcast and cast to dst's dtype as copy_
/// does) into the xla tensor `dst`, rebinding dst's storage.
void write(const at::Tensor& dst, const at::Tensor& src);

/// Grows an xla storage to at least `nbytes` (resize_ and the hooks).
void grow_storage(c10::StorageImpl& storage, size_t nbytes);

/// Releases the host copies of every live xla storage (mark_step).
void release_host_copies();

/// The ElementType that holds `type` on the device, false when none does
/// (the complex types: Note [Complex tensors on the xla device]).
bool element_type_of(c10::ScalarType type, ElementType& out);

/// Note [Complex tensors on the xla device]
/// A complex tensor's storage holds its parts interleaved, as LibTorch's
/// does, in a buffer of the part's type (f32 for complex64, which is also
/// XLA's layout of complex<f32>). So view_as_real of it is a view of that
/// storage like any other, read and written by the lowered kernels as a
/// real tensor; the kernels that lower complex ops (the FFTs, copies,
/// fills) take their complex operands and results through it
/// (complex_value and write_complex in lowering_kernels.h), and every
/// other op on a complex tensor takes the CPU fallback. element_type_of
/// refuses the complex types, so no real kernel mistakes such a tensor for
/// a real one. This sets `out` to the part's type for a complex `type`.
bool complex_storage_type_of(c10::ScalarType type, ElementType& out);

}  // namespace strata::xla::detail
