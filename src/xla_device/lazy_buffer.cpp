// LazyBuffer, the allocator of xla storages, and reading and writing xla
// tensors through them (Note [Storage-backed xla tensors] in lazy_buffer.h).
#include "lazy_buffer.h"

#include <chrono>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_set>

#include "strata/core/error.h"
#include "strata/xla/error.h"
#include "runtime.h"

namespace strata::xla::detail {
namespace {

// Every live LazyBuffer, for mark_step. Lock order: this mutex, then a
// buffer's.
std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<LazyBuffer*>& live_buffers() {
  static auto* set = new std::unordered_set<LazyBuffer*>();  // outlives static destructors
  return *set;
}

void delete_buffer(void* ptr) { delete static_cast<LazyBuffer*>(ptr); }

std::atomic<uint64_t> next_serial{0};

Bytes zeros(size_t n) { return std::make_shared<const std::vector<uint8_t>>(n, uint8_t{0}); }

class XlaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex index = current_device();
    auto* buffer = new LazyBuffer(n, index);
    return {buffer, buffer, &delete_buffer, c10::Device(c10::DeviceType::PrivateUse1, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_buffer; }
  // Clones (Allocator::clone) pass the base pointers, which are the
  // LazyBuffers themselves.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    auto& to = *static_cast<LazyBuffer*>(dest);
    const auto& from = *static_cast<const LazyBuffer*>(src);
    Bytes source = from.host_bytes();
    auto bytes = std::make_shared<std::vector<uint8_t>>(*to.host_bytes());
    STRATA_ASSERT(count <= bytes->size() && count <= source->size(), "[xla] copy_data of ", count,
                     " bytes between storages of ", source->size(), " and ", bytes->size());
    std::memcpy(bytes->data(), source->data(), count);
    to.assign(std::move(bytes), ElementType::kU8);
  }
};

}  // namespace

LazyBuffer::LazyBuffer(size_t nbytes, int device_index)
    : nbytes_(nbytes), device_index_(device_index), serial_(next_serial.fetch_add(1)) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_buffers().insert(this);
}

LazyBuffer::~LazyBuffer() {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_buffers().erase(this);
}

size_t LazyBuffer::nbytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nbytes_;
}

bool LazyBuffer::on_device() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::holds_alternative<OnDevice>(value_);
}

Bytes LazyBuffer::host_bytes() const {
  std::unique_lock<std::mutex> lock(mutex_);
  while (std::holds_alternative<Pending>(value_)) {
    // The bytes of a pending value: the whole step runs first (Note [One
    // program per step] in recorder.cpp).
    lock.unlock();
    sync_pending();
    lock.lock();
  }
  if (const auto* value = std::get_if<OnDevice>(&value_)) {
    if (!value->host) {
      auto bytes = std::make_shared<std::vector<uint8_t>>(nbytes_);
      const auto start = std::chrono::steady_clock::now();
      value->buffer->to_host(bytes->data(), bytes->size());
      count_download(bytes->size(), std::chrono::steady_clock::now() - start);
      value->host = std::move(bytes);
    }
    return value->host;
  }
  return zeros(nbytes_);
}

void LazyBuffer::assign(Bytes bytes, ElementType type) {
  std::lock_guard<std::mutex> lock(mutex_);
  assign_locked(std::move(bytes), type);
}

void LazyBuffer::assign_locked(Bytes bytes, ElementType type) {
  STRATA_ASSERT(bytes && bytes->size() == nbytes_, "[xla] a storage of ", nbytes_, " bytes was assigned ",
                   bytes ? bytes->size() : 0, " bytes");
  if (nbytes_ == 0) {
    value_ = Unwritten{};  // nothing to hold; PJRT buffers are never empty here
    return;
  }
  size_t width = element_size(type);
  if (nbytes_ % width != 0) {
    type = ElementType::kU8;
    width = 1;
  }
  const std::vector<int64_t> dims{static_cast<int64_t>(nbytes_ / width)};
  const auto start = std::chrono::steady_clock::now();
  auto buffer = std::make_shared<const Buffer>(
      client().buffer_from_host(bytes->data(), bytes->size(), type, dims, pjrt_device(device_index_)));
  count_upload(bytes->size(), std::chrono::steady_clock::now() - start);
  value_ = OnDevice{std::move(buffer), stablehlo::Type{type, dims}, std::move(bytes), nullptr};
}

std::vector<uint8_t> LazyBuffer::bytes_locked() const {
  STRATA_ASSERT(!std::holds_alternative<Pending>(value_), "[xla] the bytes of a pending storage were read unsynced");
  const auto* value = std::get_if<OnDevice>(&value_);
  if (value == nullptr) return std::vector<uint8_t>(nbytes_, uint8_t{0});
  if (value->host) return *value->host;
  std::vector<uint8_t> bytes(nbytes_);
  const auto start = std::chrono::steady_clock::now();
  value->buffer->to_host(bytes.data(), bytes.size());
  count_download(bytes.size(), std::chrono::steady_clock::now() - start);
  return bytes;
}

void LazyBuffer::update(const std::function<void(std::vector<uint8_t>&)>& change, ElementType type,
                        bool overwrite) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!overwrite && std::holds_alternative<Pending>(value_)) {
    lock.unlock();
    sync_pending();
    lock.lock();
  }
  auto bytes = overwrite ? std::make_shared<std::vector<uint8_t>>(nbytes_)
                         : std::make_shared<std::vector<uint8_t>>(bytes_locked());
  change(*bytes);
  assign_locked(std::move(bytes), type);
}

void LazyBuffer::grow(size_t nbytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (nbytes <= nbytes_) return;
  while (std::holds_alternative<Pending>(value_)) {
    lock.unlock();
    sync_pending();
    lock.lock();
  }
  if (std::holds_alternative<Unwritten>(value_)) {
    nbytes_ = nbytes;
    return;
  }
  const ElementType type = std::get<OnDevice>(value_).buffer->element_type();
  auto bytes = std::make_shared<std::vector<uint8_t>>(bytes_locked());
  bytes->resize(nbytes, uint8_t{0});
  nbytes_ = nbytes;
  assign_locked(std::move(bytes), type);
}

bool LazyBuffer::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::holds_alternative<Pending>(value_);
}

lazy::NodePtr LazyBuffer::value_node(ElementType type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return value_node_locked(type);
}

lazy::NodePtr LazyBuffer::value_node_locked(ElementType type) const {
  const size_t width = element_size(type);
  if (nbytes_ == 0 || nbytes_ % width != 0) return nullptr;
  const stablehlo::Type want{type, {static_cast<int64_t>(nbytes_ / width)}};
  if (const auto* value = std::get_if<Pending>(&value_)) return value->node->type() == want ? value->node : nullptr;
  if (const auto* value = std::get_if<OnDevice>(&value_)) {
    if (!(value->type == want)) return nullptr;
    if (!value->node) value->node = lazy::Node::buffer(value->buffer, want);
    return value->node;
  }
  return lazy::Node::op("zeros", {}, want, lazy::Attributes{}.add(want),
                        [want](stablehlo::Function& f, const std::vector<stablehlo::Value>&) {
                          return f.constant(want, {0.0});
                        });
}

void LazyBuffer::set_pending(lazy::NodePtr node) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATA_ASSERT(node && node->type().dims.size() == 1 &&
                    static_cast<size_t>(node->type().numel()) * element_size(node->type().dtype) == nbytes_,
                "[xla] a storage of ", nbytes_, " bytes was bound to a value of ",
                node ? node->type().text() : std::string("null"));
  value_ = Pending{std::move(node)};
}

bool LazyBuffer::rewrite(ElementType type, const std::function<lazy::NodePtr(const lazy::NodePtr&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  lazy::NodePtr base = value_node_locked(type);
  if (!base) return false;
  lazy::NodePtr next = change(base);
  if (!next) return false;
  STRATA_ASSERT(next->type() == base->type(), "[xla] a storage holding ", base->type().text(), " was rewritten to ",
                next->type().text());
  value_ = Pending{std::move(next)};
  return true;
}

lazy::NodePtr LazyBuffer::pending_node() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto* value = std::get_if<Pending>(&value_);
  return value ? value->node : nullptr;
}

bool LazyBuffer::bind_result(const lazy::NodePtr& node, std::shared_ptr<const Buffer> result) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto* value = std::get_if<Pending>(&value_);
  if (value == nullptr || value->node != node) return false;
  value_ = OnDevice{std::move(result), node->type(), nullptr, nullptr};
  return true;
}

void LazyBuffer::release_host_copy() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto* value = std::get_if<OnDevice>(&value_)) value->host.reset();
}

c10::Allocator* allocator() {
  static XlaAllocator instance;
  return &instance;
}

LazyBuffer& lazy_buffer(const c10::StorageImpl& storage) {
  const c10::DataPtr& ptr = storage.data_ptr();
  if (ptr.get_deleter() != &delete_buffer || ptr.get_context() == nullptr)
    throw XlaError(strata::detail::cat("[xla] a storage on ", ptr.device(),
                                       " was not made by the xla allocator; create xla tensors with "
                                       "torch::empty/zeros/... on strata::xla::device() or with .to(device)"));
  return *static_cast<LazyBuffer*>(ptr.get_context());
}

LazyBuffer& lazy_buffer(const at::Tensor& tensor) { return lazy_buffer(*tensor.storage().unsafeGetStorageImpl()); }

at::Tensor host_view(const at::Tensor& xla) {
  Bytes bytes = lazy_buffer(xla).host_bytes();
  static uint8_t empty_storage = 0;
  void* data = bytes->empty() ? &empty_storage : const_cast<uint8_t*>(bytes->data());
  return at::for_blob(data, xla.sizes())
      .strides(xla.strides())
      .storage_offset(xla.storage_offset())
      .deleter([keep = bytes](void*) mutable { keep.reset(); })
      .options(at::TensorOptions().dtype(xla.scalar_type()).device(at::kCPU))
      .make_tensor();
}

void write(const at::Tensor& dst, const at::Tensor& src) {
  LazyBuffer& buffer = lazy_buffer(dst);
  ElementType type = ElementType::kU8;
  if (!element_type_of(dst.scalar_type(), type)) complex_storage_type_of(dst.scalar_type(), type);
  const bool covers_storage = dst.is_contiguous() && dst.storage_offset() == 0 &&
                              static_cast<size_t>(dst.numel()) * dst.element_size() == buffer.nbytes();
  // The storage's current bytes, with dst's part replaced: a write to a
  // view leaves the rest of its base alone.
  buffer.update(
      [&](std::vector<uint8_t>& bytes) {
        static uint8_t empty_storage = 0;
        void* data = bytes.empty() ? &empty_storage : bytes.data();
        at::Tensor target = at::for_blob(data, dst.sizes())
                                .strides(dst.strides())
                                .storage_offset(dst.storage_offset())
                                .options(at::TensorOptions().dtype(dst.scalar_type()).device(at::kCPU))
                                .make_tensor();
        target.copy_(src);
      },
      type, covers_storage);
}

void grow_storage(c10::StorageImpl& storage, size_t nbytes) {
  if (nbytes <= storage.nbytes()) return;
  STRATA_ASSERT(storage.resizable(), "[xla] resizing a storage that is not resizable");
  lazy_buffer(storage).grow(nbytes);
  storage.set_nbytes(nbytes);
}

void release_host_copies() {
  std::lock_guard<std::mutex> lock(live_mutex());
  for (LazyBuffer* buffer : live_buffers()) buffer->release_host_copy();
}

std::vector<PendingValue> pending_values() {
  std::vector<std::pair<uint64_t, PendingValue>> found;
  {
    std::lock_guard<std::mutex> lock(live_mutex());
    for (LazyBuffer* buffer : live_buffers()) {
      if (lazy::NodePtr node = buffer->pending_node())
        found.push_back({buffer->serial(), PendingValue{buffer, std::move(node), buffer->device_index()}});
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PendingValue> out;
  out.reserve(found.size());
  for (auto& [serial, value] : found) out.push_back(std::move(value));
  return out;
}

size_t bind_results(const std::vector<PendingValue>& values,
                    const std::vector<std::shared_ptr<const Buffer>>& results) {
  STRATA_ASSERT(values.size() == results.size(), "[xla] ", results.size(), " results for ", values.size(),
                " pending values");
  // Under the live set's lock, a storage freed since pending_values() is
  // not touched; one made since at the same address holds another node.
  std::lock_guard<std::mutex> lock(live_mutex());
  size_t bound = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (live_buffers().count(values[i].buffer) && values[i].buffer->bind_result(values[i].node, results[i])) ++bound;
  }
  return bound;
}

bool complex_storage_type_of(c10::ScalarType type, ElementType& out) {
  switch (type) {
    case c10::ScalarType::ComplexHalf: out = ElementType::kF16; return true;
    case c10::ScalarType::ComplexFloat: out = ElementType::kF32; return true;
    case c10::ScalarType::ComplexDouble: out = ElementType::kF64; return true;
    default: return false;
  }
}

bool element_type_of(c10::ScalarType type, ElementType& out) {
  switch (type) {
    case c10::ScalarType::Bool: out = ElementType::kPred; return true;
    case c10::ScalarType::Char: out = ElementType::kS8; return true;
    case c10::ScalarType::Short: out = ElementType::kS16; return true;
    case c10::ScalarType::Int: out = ElementType::kS32; return true;
    case c10::ScalarType::Long: out = ElementType::kS64; return true;
    case c10::ScalarType::Byte: out = ElementType::kU8; return true;
    case c10::ScalarType::UInt16: out = ElementType::kU16; return true;
    case c10::ScalarType::UInt32: out = ElementType::kU32; return true;
    case c10::ScalarType::UInt64: out = ElementType::kU64; return true;
    case c10::ScalarType::Half: out = ElementType::kF16; return true;
    case c10::ScalarType::BFloat16: out = ElementType::kBF16; return true;
    case c10::ScalarType::Float: out = ElementType::kF32; return true;
    case c10::ScalarType::Double: out = ElementType::kF64; return true;
    default: return false;
  }
}

}  // namespace strata::xla::detail
