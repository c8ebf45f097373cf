// src/core/tensor.cpp: shapes, the aligned storage allocator and the
// out-of-line members of Tensor<T>.
#include "multihead/tensor.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <utility>

#include "multihead/error.hpp"

namespace multihead {

std::string shape_to_string(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += ")";
  return out;
}

int64_t shape_numel(const Shape& shape) {
  // Check every dimension for sign first, so "(-1, 0)" is reported as a
  // negative dimension rather than silently giving 0 elements.
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw Error(Error::Kind::Shape, "shape " + shape_to_string(shape) + ": dimension " + std::to_string(i) +
                                          " is negative (" + std::to_string(shape[i]) + ")");
    }
  }
  // Like NumPy, require the product of the nonzero dimensions to fit even
  // when a zero makes the count 0: then every partial product a caller forms
  // (strides, L·S) fits too, and (2^62, 4, 0) is rejected, not accepted.
  int64_t nonzero = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d == 0) {
      has_zero = true;
    } else if (__builtin_mul_overflow(nonzero, d, &nonzero)) {
      throw Error(Error::Kind::Shape,
                  "shape " + shape_to_string(shape) + ": product of dimensions overflows int64");
    }
  }
  return has_zero ? 0 : nonzero;
}

namespace {

constexpr std::size_t kCacheLine = 64;
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kHugeThreshold = std::size_t{4} << 20;

}  // namespace

void* allocate_storage(std::size_t bytes) {
  const std::size_t align = bytes >= kHugeThreshold ? kHugePage : kCacheLine;
  // aligned_alloc wants a size that is a multiple of the alignment (C11
  // 7.22.3.1); a zero-byte request still gets a unique, freeable block.
  if (bytes > SIZE_MAX - align) throw std::bad_alloc();
  const std::size_t rounded = bytes == 0 ? align : (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (align == kHugePage) {
    // Advice only: kernels without THP (or with it disabled) refuse with
    // EINVAL, and the block is still perfectly usable with 4 KiB pages.
    (void)madvise(p, rounded, MADV_HUGEPAGE);
  }
  return p;
}

void free_storage(void* p) noexcept { std::free(p); }

template <class T>
Tensor<T>::Tensor(Shape shape, Storage<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
  const int64_t expected = shape_numel(shape_);
  if (static_cast<uint64_t>(expected) != data_.size()) {
    throw Error(Error::Kind::Shape, "tensor of shape " + shape_to_string(shape_) + ": expected " +
                                        std::to_string(expected) + " elements, got " +
                                        std::to_string(data_.size()));
  }
}

template <class T>
Tensor<T> Tensor<T>::view(Shape shape, T* data) {
  const int64_t n = shape_numel(shape);
  if (data == nullptr && n > 0)
    throw Error(Error::Kind::Value, "tensor view of shape " + shape_to_string(shape) + ": null data pointer");
  Tensor t;
  t.shape_ = std::move(shape);
  // A view of no elements is an ordinary empty tensor: nothing to share.
  if (n > 0) {
    t.view_ = data;
    t.view_numel_ = n;
  }
  return t;
}

template <class T>
Tensor<T>::Tensor(const Tensor& other)
    : shape_(other.shape_),
      data_(other.view_ ? Storage<T>(other.view_, other.view_ + other.view_numel_) : other.data_) {}

template <class T>
Tensor<T>::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      data_(std::move(other.data_)),
      view_(std::exchange(other.view_, nullptr)),
      view_numel_(std::exchange(other.view_numel_, 0)) {}

// Element-wise into the existing storage, as the defaulted assignment did
// (a buffer large enough is reused), also when `other` is a view.
template <class T>
Tensor<T>& Tensor<T>::operator=(const Tensor& other) {
  if (this == &other) return *this;
  if (other.view_) data_.assign(other.view_, other.view_ + other.view_numel_);
  else data_ = other.data_;
  shape_ = other.shape_;
  view_ = nullptr;
  view_numel_ = 0;
  return *this;
}

template <class T>
Tensor<T>& Tensor<T>::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  shape_ = std::move(other.shape_);
  data_ = std::move(other.data_);
  view_ = std::exchange(other.view_, nullptr);
  view_numel_ = std::exchange(other.view_numel_, 0);
  return *this;
}

template <class T>
void Tensor<T>::throw_no_storage() {
  throw Error(Error::Kind::Value, "tensor: vec() on a view, which has no storage (use data() and numel())");
}

namespace {

// `have` is the element count actually stored (a default-constructed tensor
// has shape () but no elements).
void check_reshape(const Shape& from, int64_t have, const Shape& to) {
  const int64_t want = shape_numel(to);
  if (have != want) {
    throw Error(Error::Kind::Shape, "reshape from " + shape_to_string(from) + " to " + shape_to_string(to) +
                                        ": expected " + std::to_string(have) + " elements, new shape has " +
                                        std::to_string(want));
  }
}

}  // namespace

template <class T>
Tensor<T> Tensor<T>::reshaped(Shape shape) const& {
  check_reshape(shape_, numel(), shape);
  if (view_) return Tensor(std::move(shape), Storage<T>(view_, view_ + view_numel_));
  return Tensor(std::move(shape), data_);
}

template <class T>
Tensor<T> Tensor<T>::reshaped(Shape shape) && {
  check_reshape(shape_, numel(), shape);
  if (view_) {
    view_numel_ = 0;
    return view(std::move(shape), std::exchange(view_, nullptr));
  }
  return Tensor(std::move(shape), std::move(data_));
}

template class Tensor<float>;
template class Tensor<double>;
template class Tensor<uint8_t>;
template class Tensor<bfloat16>;
template class Tensor<float16>;

}  // namespace multihead
