// multihead/tensor.hpp: the small dense tensor type every public function
// takes and returns.
//
// A Tensor<T> owns a contiguous, row-major (C order) buffer and a shape, or,
// made by Tensor::view, reads and writes a buffer its caller owns (how the
// Python module hands NumPy arrays to forward() without a copy). It is
// deliberately plain: no strides, no broadcasting. Shapes are
// checked at the API boundary (see error.hpp) and the kernels index raw
// pointers. T is float or double for data (bfloat16 or float16, multihead/narrow.hpp,
// for the narrow modules' storage), and `bool` masks use Tensor<uint8_t>
// (0 = may attend, nonzero = may not attend, as PyTorch's bool masks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "multihead/narrow.hpp"

namespace multihead {

// Storage allocator for tensors and workspaces: 64-byte aligned (a cache line,
// and a full AVX-512 vector), and for blocks of 4 MiB or more aligned to 2 MiB
// and advised as transparent huge pages. On the machines we measured, a
// first-touched 4 KiB page costs ~13 µs, so a large fresh buffer fills at
// 0.3 GB/s; with huge pages it fills at ~16 GB/s.
//
// Kept blocks: a freed block of 256 KiB or more is kept (up to a limit,
// oldest freed first when over it) and handed to the next request of the
// same size class, already faulted in, instead of going back to the C
// library, which returns large blocks to the kernel. A training step that
// allocates the same gradients every step then stops paying page faults
// (they were 29% of a bf16 step at (8, 128, 512, 8) in a Python loop: glibc
// kept unmapping and remapping its blocks). The cost: memory a program
// freed stays in its resident set, up to the limit, and a program's peak can
// be higher by as much. The limit is MULTIHEAD_KEPT_STORAGE_MIB (read once;
// default 256, 0 keeps nothing) or set_kept_storage_limit();
// release_kept_storage() gives it all back. Builds under AddressSanitizer
// keep nothing (a use after free must still be caught).
//
// free_storage takes the byte count the block was allocated with.
void* allocate_storage(std::size_t bytes);
void free_storage(void* p, std::size_t bytes) noexcept;

// What is kept now, and the limit.
struct KeptStorage {
  std::size_t bytes = 0;
  std::size_t blocks = 0;
  std::size_t limit_bytes = 0;
};
KeptStorage kept_storage();
// Frees every kept block; returns the bytes freed.
std::size_t release_kept_storage();
// Sets the limit (0: keep nothing; kept blocks above it are freed now).
void set_kept_storage_limit(std::size_t bytes);

// Storage<T>(n) and resize(n) leave the new elements uninitialised (default
// initialisation: no zero-fill pass over memory the caller writes next);
// Storage<T>(n, T{}) and Tensor(shape) are zeros. A zero-fill was 5% of a
// bf16 training step at (8, 128, 512, 8) (perf, AMD Zen 5).
template <class T>
struct StorageAllocator {
  using value_type = T;
  StorageAllocator() = default;
  template <class U>
  StorageAllocator(const StorageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(allocate_storage(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { free_storage(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    // Element types here (float, double, uint8_t, bfloat16, float16) are
    // implicit-lifetime types: the allocation created them. bfloat16's
    // default member initialiser would zero it; skipped here.
    if constexpr (!(std::is_trivially_copyable_v<U> && std::is_trivially_destructible_v<U>))
      ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const StorageAllocator<U>&) const noexcept { return true; }
};

template <class T>
using Storage = std::vector<T, StorageAllocator<T>>;

using Shape = std::vector<int64_t>;

// "(2, 3, 4)": the format every error message uses for shapes, so an
// expected and an actual shape read the same way. A 1-D shape prints "(5)".
// A shape as "(2, 3, 8)". One of more than 16 dimensions is cut: its first
// 8, then "... (N dimensions)", so a message about it stays one short line.
std::string shape_to_string(const Shape& shape);

// The most dimensions a file's tensor may have: NumPy's NPY_MAXDIMS (64 in
// NumPy 2, 32 before). The .npy and safetensors readers refuse more.
inline constexpr std::size_t kMaxDims = 64;

// Number of elements of `shape`. Throws multihead::Error when a dimension is
// negative or the product overflows int64 (hostile headers can claim that).
int64_t shape_numel(const Shape& shape);

template <class T>
class Tensor {
 public:
  using value_type = T;

  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(std::move(shape)), data_(checked_size(shape_), T{}) {}  // zeros
  // A tensor of `shape` whose elements are not initialised, for a result
  // the caller writes in full before anything reads it.
  static Tensor uninitialized(Shape shape);
  Tensor(Shape shape, T fill) : shape_(std::move(shape)), data_(checked_size(shape_), fill) {}
  Tensor(Shape shape, Storage<T> data);  // throws if data.size() != numel(shape)

  // A view of the numel(shape) contiguous, row-major elements at `data`: no
  // copy, no ownership. The caller keeps the buffer alive, and unchanged, for
  // as long as the view (or a call it was passed to) is in use; a view of
  // read-only memory must only be passed as `const Tensor&`. Copying a view
  // copies its elements into an owning tensor; moving one moves the view.
  // vec() throws on a view (there is no Storage): use data() and numel().
  // Throws multihead::Error if the shape is invalid or data is null while
  // numel(shape) > 0. (Two tensors that share data() are taken by forward()
  // as one tensor, so views that start at the same address must also have
  // the same shape.)
  static Tensor view(Shape shape, T* data);
  bool is_view() const { return view_ != nullptr; }

  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;

  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(static_cast<std::size_t>(d < 0 ? d + dim() : d)); }
  int64_t numel() const { return view_ ? view_numel_ : static_cast<int64_t>(data_.size()); }
  bool empty() const { return numel() == 0; }

  T* data() { return view_ ? view_ : data_.data(); }
  const T* data() const { return view_ ? view_ : data_.data(); }
  Storage<T>& vec() {
    if (view_) throw_no_storage();
    return data_;
  }
  const Storage<T>& vec() const {
    if (view_) throw_no_storage();
    return data_;
  }

  T& operator[](int64_t i) { return data()[i]; }
  const T& operator[](int64_t i) const { return data()[i]; }

  // Same elements, new shape of equal numel (throws otherwise).
  Tensor reshaped(Shape shape) const&;
  Tensor reshaped(Shape shape) &&;

 private:
  static std::size_t checked_size(const Shape& s) { return static_cast<std::size_t>(shape_numel(s)); }
  [[noreturn]] static void throw_no_storage();
  Shape shape_;
  Storage<T> data_;     // empty for a view
  T* view_ = nullptr;   // set only for a view
  int64_t view_numel_ = 0;
};

extern template class Tensor<float>;
extern template class Tensor<double>;
extern template class Tensor<uint8_t>;
extern template class Tensor<bfloat16>;
extern template class Tensor<float16>;

// Element-type conversion (float <-> double; uint8 -> float for masks).
template <class To, class From>
Tensor<To> tensor_cast(const Tensor<From>& t) {
  Storage<To> out(t.data(), t.data() + t.numel());
  return Tensor<To>(t.shape(), std::move(out));
}

}  // namespace multihead
