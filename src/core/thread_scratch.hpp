// src/core/thread_scratch.hpp: a buffer kept between calls, one per calling
// thread and use site (declare it thread_local where it is used): floats
// (ThreadScratch), or another element type (BasicThreadScratch<T>: the bf16
// pieces of core/gemm.cpp's split f16 product).
//
// Why: a first-touched page costs ~13 µs here (attention/workspace.hpp), so
// a product that allocates its float32 copies afresh on every call spends
// a large part of a small call in page faults: the 16-bit projections did,
// 16-22% of a (1, 1024, 768, 12) bf16 forward, before their widened copies
// and sums moved into these. The buffer grows to the largest size a thread
// has asked for and is freed when that thread ends; it is never shared, so
// it needs no lock. A site must not take it again while its pointer is in
// use (none of the uses below is reentrant).
#pragma once

#include <cstddef>
#include <memory>

namespace multihead::detail {

template <class T>
class BasicThreadScratch {
 public:
  // n elements, uninitialised (whatever an earlier call left).
  T* take(std::size_t n) {
    if (n > capacity_) {
      data_.reset();  // the old buffer goes before the new one is allocated
      data_.reset(new T[n]);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t capacity_ = 0;
};
using ThreadScratch = BasicThreadScratch<float>;

}  // namespace multihead::detail
