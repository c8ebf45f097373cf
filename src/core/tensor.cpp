// src/core/tensor.cpp: shapes, the aligned storage allocator and the
// out-of-line members of Tensor<T>.
#include "multihead/tensor.hpp"

#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "multihead/error.hpp"

namespace multihead {

std::string shape_to_string(const Shape& shape) {
  const bool cut = shape.size() > 16;
  const std::size_t shown = cut ? 8 : shape.size();
  std::string out = "(";
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (cut) out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
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
// Kept blocks (multihead/tensor.hpp): from 256 KiB, in size classes of
// 64 KiB (2 MiB from kHugeThreshold, the huge-page rounding), so a request a
// few bytes longer or shorter than last step's still finds its block. Pages
// of a class's tail that nobody writes are never faulted in.
constexpr std::size_t kKeepFrom = std::size_t{256} << 10;
constexpr std::size_t kKeepClass = std::size_t{64} << 10;
constexpr std::size_t kDefaultKeptMiB = 256;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kKeepingBuilt = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kKeepingBuilt = false;
#else
constexpr bool kKeepingBuilt = true;
#endif
#else
constexpr bool kKeepingBuilt = true;
#endif

// The alignment and the rounded size a request of `bytes` gets; the same
// function for allocate_storage and free_storage, so both agree on a block's
// size class.
struct BlockSize {
  std::size_t align;
  std::size_t rounded;
};

BlockSize block_size(std::size_t bytes) {
  const std::size_t align = bytes >= kHugeThreshold ? kHugePage : kCacheLine;
  const std::size_t unit = align == kHugePage ? kHugePage : bytes >= kKeepFrom ? kKeepClass : kCacheLine;
  // aligned_alloc wants a size that is a multiple of the alignment (C11
  // 7.22.3.1); a zero-byte request still gets a unique, freeable block.
  if (bytes > SIZE_MAX - unit) throw std::bad_alloc();
  return {align, bytes == 0 ? unit : (bytes + unit - 1) / unit * unit};
}

void* fresh_block(const BlockSize& b) {
  void* p = std::aligned_alloc(b.align, b.rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (b.align == kHugePage) {
    // Advice only: kernels without THP (or with it disabled) refuse with
    // EINVAL, and the block is still perfectly usable with 4 KiB pages.
    (void)madvise(p, b.rounded, MADV_HUGEPAGE);
  }
  return p;
}

std::size_t limit_from_environment() {
  const char* v = std::getenv("MULTIHEAD_KEPT_STORAGE_MIB");
  if (v == nullptr || *v == '\0') return kDefaultKeptMiB << 20;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mib = std::strtoull(v, &end, 10);
  // Not a whole number of MiB (or absurdly large): the default, said once
  // on stderr, rather than failing an allocation over a tuning knob.
  if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || v[0] == '+' || mib > (SIZE_MAX >> 21)) {
    std::fprintf(stderr,
                 "multihead: MULTIHEAD_KEPT_STORAGE_MIB: expected a whole number of MiB (0 keeps nothing), got '%s'; "
                 "using %zu\n",
                 v, kDefaultKeptMiB);
    return kDefaultKeptMiB << 20;
  }
  return static_cast<std::size_t>(mib) << 20;
}

// The kept blocks, oldest first. Never destroyed: tensors in static
// objects free their storage after main returns, and must find it alive.
class KeptBlocks {
 public:
  static KeptBlocks& instance() {
    static KeptBlocks* const kept = [] {
      static KeptBlocks* made = new KeptBlocks();
      // A fork() while another thread holds the lock (an OpenMP worker
      // growing its flash scratch, say) would leave the child's copy locked
      // forever: hold it across the fork, as malloc does its own, and
      // release it on both sides.
      (void)pthread_atfork([] { made->mutex_.lock(); }, [] { made->mutex_.unlock(); },
                           [] { made->mutex_.unlock(); });
      return made;
    }();
    return *kept;
  }

  // A kept block of exactly this class (the newest: its lines are the most
  // likely still in cache), or null.
  void* take(const BlockSize& b) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      if (blocks_[i].bytes == b.rounded && blocks_[i].align == b.align) {
        void* found = blocks_[i].p;
        bytes_ -= b.rounded;
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        return found;
      }
    }
    return nullptr;
  }

  // Keeps p (of size class b) if the limit allows, else frees it.
  // Keeps p (of size class b), freeing the oldest kept blocks to stay
  // within the limit; a block larger than the limit is freed.
  void give(void* p, const BlockSize& b) noexcept {
    std::vector<Block> evicted;
    bool kept = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (b.rounded <= limit_) {
        try {
          std::size_t n = 0, freed = 0;
          while (bytes_ - freed + b.rounded > limit_) freed += blocks_[n++].bytes;
          evicted.assign(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n));
          blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n));
          bytes_ -= freed;
          blocks_.push_back({p, b.rounded, b.align});
          bytes_ += b.rounded;
          kept = true;
        } catch (...) {  // no room to note it: free it instead
        }
      }
    }
    for (const Block& e : evicted) std::free(e.p);
    if (!kept) std::free(p);
  }

  KeptStorage stats() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return {bytes_, blocks_.size(), limit_};
  }

  std::size_t set_limit(std::size_t limit) {
    std::vector<Block> evicted;
    std::size_t freed = 0;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      limit_ = limit;
      std::size_t n = 0;
      while (n < blocks_.size() && bytes_ - freed > limit_) freed += blocks_[n++].bytes;
      evicted.assign(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n));
      blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n));
      bytes_ -= freed;
    }
    for (const Block& b : evicted) std::free(b.p);
    return freed;
  }

  std::size_t limit() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }

 private:
  struct Block {
    void* p;
    std::size_t bytes;
    std::size_t align;
  };
  KeptBlocks() : limit_(kKeepingBuilt ? limit_from_environment() : 0) {}

  std::mutex mutex_;
  std::vector<Block> blocks_;
  std::size_t bytes_ = 0;
  std::size_t limit_;
};

bool keeps(std::size_t rounded) { return kKeepingBuilt && rounded >= kKeepFrom; }

}  // namespace

void* allocate_storage(std::size_t bytes) {
  const BlockSize b = block_size(bytes);
  if (keeps(b.rounded)) {
    if (void* p = KeptBlocks::instance().take(b)) return p;
  }
  return fresh_block(b);
}

void free_storage(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < SIZE_MAX - kHugePage) {
    const BlockSize b = block_size(bytes);
    if (keeps(b.rounded)) {
      KeptBlocks::instance().give(p, b);
      return;
    }
  }
  std::free(p);
}

KeptStorage kept_storage() { return KeptBlocks::instance().stats(); }

std::size_t release_kept_storage() {
  KeptBlocks& kept = KeptBlocks::instance();
  const std::size_t limit = kept.limit();
  const std::size_t freed = kept.set_limit(0);
  kept.set_limit(limit);
  return freed;
}

void set_kept_storage_limit(std::size_t bytes) { KeptBlocks::instance().set_limit(kKeepingBuilt ? bytes : 0); }

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
Tensor<T> Tensor<T>::uninitialized(Shape shape) {
  Storage<T> data(checked_size(shape));  // Storage(n): no fill (StorageAllocator)
  return Tensor(std::move(shape), std::move(data));
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
