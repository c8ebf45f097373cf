// src/distributed/communicator.cpp: the collectives the distributed modes use,
// on the caller's communicator (duplicated), with their bytes and time counted.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "multihead/distributed.hpp"

namespace multihead::distributed {
namespace {

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <>
MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <>
MPI_Datatype mpi_type<uint8_t>() { return MPI_UINT8_T; }
template <>
MPI_Datatype mpi_type<int>() { return MPI_INT; }

// MPI counts are int; a point-to-point message past that goes in pieces.
constexpr int64_t kMaxCount = int64_t{1} << 30;

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(Error::Kind::IO, std::string(call) + ": " + std::string(text, static_cast<std::size_t>(length)));
}

int as_count(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    throw Error(Error::Kind::Value, std::string(what) + ": expected at most " + std::to_string(INT_MAX) +
                                        " values per rank in one collective, got " + std::to_string(n));
  return static_cast<int>(n);
}

// Times the scope into stats.seconds.
class Timed {
 public:
  explicit Timed(CommStats& stats) : stats_(stats), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() { stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  CommStats& stats_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Request::Request(Request&& other) noexcept : requests_(std::move(other.requests_)) {
  other.requests_.clear();
}
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (pending()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_ = std::move(other.requests_);
    other.requests_.clear();
  }
  return *this;
}
Request::~Request() {
  // Never throws: a destructor. A failure here is MPI's fatal handler's.
  if (pending()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
}

Communicator::Communicator(MPI_Comm comm) {
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Communicator::agree(const std::function<void()>& check) {
  Error::Kind kind = Error::Kind::Value;
  std::string message;
  bool failed = false;
  try {
    check();
  } catch (const Error& e) {
    failed = true;
    kind = e.kind();
    message = e.what();
  } catch (const std::bad_alloc&) {
    failed = true;
    message = "out of memory";
  }
  Timed timed(stats_);
  // The lowest failing rank, or size_ when none failed.
  int first = failed ? rank_ : size_;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
  stats_.bytes_sent += sizeof(int);
  if (first == size_) return;
  int header[2] = {static_cast<int>(kind), static_cast<int>(std::min<std::size_t>(message.size(), 1 << 20))};
  check_mpi(MPI_Bcast(header, 2, MPI_INT, first, comm_), "MPI_Bcast");
  std::string text(static_cast<std::size_t>(header[1]), '\0');
  if (rank_ == first) std::memcpy(text.data(), message.data(), text.size());
  check_mpi(MPI_Bcast(text.data(), header[1], MPI_CHAR, first, comm_), "MPI_Bcast");
  if (rank_ == first) stats_.bytes_sent += sizeof header + text.size();
  throw AgreedError(static_cast<Error::Kind>(header[0]), text, first);
}

template <class T>
void Communicator::all_reduce_sum(T* data, int64_t n) {
  if (size_ == 1 || n == 0) return;
  Timed timed(stats_);
  const int P = size_;
  // Chunk j (share_of(n, P, j)) is summed by rank j: it receives every
  // rank's chunk j (all-to-all), adds them in rank order, and the chunks are
  // gathered back. The order of the additions is fixed, so is the result.
  std::vector<int> counts(P), displs(P), recv_counts(P), recv_displs(P);
  for (int j = 0; j < P; ++j) {
    const Share s = share_of(n, P, j);
    counts[j] = as_count(s.count, "all_reduce_sum");
    displs[j] = as_count(s.begin, "all_reduce_sum");
  }
  const int mine = counts[rank_];
  std::vector<T> gathered(static_cast<std::size_t>(mine) * P);
  for (int j = 0; j < P; ++j) {
    recv_counts[j] = mine;
    recv_displs[j] = j * mine;
  }
  check_mpi(MPI_Alltoallv(data, counts.data(), displs.data(), mpi_type<T>(), gathered.data(), recv_counts.data(),
                          recv_displs.data(), mpi_type<T>(), comm_),
            "MPI_Alltoallv");
  T* own = data + displs[rank_];
  for (int i = 0; i < mine; ++i) {
    T sum = gathered[static_cast<std::size_t>(i)];
    for (int j = 1; j < P; ++j) sum += gathered[static_cast<std::size_t>(j) * mine + i];
    own[i] = sum;
  }
  check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, mpi_type<T>(), data, counts.data(), displs.data(), mpi_type<T>(), comm_),
            "MPI_Allgatherv");
  const uint64_t others = static_cast<uint64_t>(n - counts[rank_]);
  stats_.bytes_sent += (others + static_cast<uint64_t>(mine) * (P - 1)) * sizeof(T);
  stats_.messages += 2 * static_cast<uint64_t>(P - 1);
}

template <class T>
void Communicator::all_reduce_max(T* data, int64_t n) {
  if (size_ == 1 || n == 0) return;
  Timed timed(stats_);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "all_reduce_max"), mpi_type<T>(), MPI_MAX, comm_),
            "MPI_Allreduce");
  stats_.bytes_sent += static_cast<uint64_t>(n) * sizeof(T);
  stats_.messages += 1;
}

template <class T>
void Communicator::broadcast(T* data, int64_t n, int root) {
  if (size_ == 1 || n == 0) return;
  Timed timed(stats_);
  check_mpi(MPI_Bcast(data, as_count(n, "broadcast"), mpi_type<T>(), root, comm_), "MPI_Bcast");
  if (rank_ == root) stats_.bytes_sent += static_cast<uint64_t>(n) * sizeof(T);
  stats_.messages += 1;
}

template <class T>
void Communicator::all_gather(const T* send, T* recv, int64_t n) {
  Timed timed(stats_);
  const int count = as_count(n, "all_gather");
  check_mpi(MPI_Allgather(send, count, mpi_type<T>(), recv, count, mpi_type<T>(), comm_), "MPI_Allgather");
  stats_.bytes_sent += static_cast<uint64_t>(n) * (size_ - 1) * sizeof(T);
  stats_.messages += static_cast<uint64_t>(size_ - 1);
}

template <class T>
void Communicator::all_to_all(const T* send, T* recv, int64_t n) {
  Timed timed(stats_);
  const int count = as_count(n, "all_to_all");
  check_mpi(MPI_Alltoall(send, count, mpi_type<T>(), recv, count, mpi_type<T>(), comm_), "MPI_Alltoall");
  stats_.bytes_sent += static_cast<uint64_t>(n) * (size_ - 1) * sizeof(T);
  stats_.messages += static_cast<uint64_t>(size_ - 1);
}

template <class T>
Request Communicator::isend(const T* data, int64_t n, int dest, int tag) {
  Timed timed(stats_);
  Request r;
  for (int64_t at = 0; at < n || (n == 0 && at == 0); at += kMaxCount) {
    MPI_Request q;
    const int count = static_cast<int>(std::min(kMaxCount, n - at));
    check_mpi(MPI_Isend(data + at, count, mpi_type<T>(), dest, tag, comm_, &q), "MPI_Isend");
    r.requests_.push_back(q);
    stats_.messages += 1;
    if (n == 0) break;
  }
  stats_.bytes_sent += static_cast<uint64_t>(n) * sizeof(T);
  return r;
}

template <class T>
Request Communicator::irecv(T* data, int64_t n, int source, int tag) {
  Timed timed(stats_);
  Request r;
  for (int64_t at = 0; at < n || (n == 0 && at == 0); at += kMaxCount) {
    MPI_Request q;
    const int count = static_cast<int>(std::min(kMaxCount, n - at));
    check_mpi(MPI_Irecv(data + at, count, mpi_type<T>(), source, tag, comm_, &q), "MPI_Irecv");
    r.requests_.push_back(q);
    if (n == 0) break;
  }
  return r;
}

void Communicator::wait(Request& request) {
  if (!request.pending()) return;
  Timed timed(stats_);
  check_mpi(MPI_Waitall(static_cast<int>(request.requests_.size()), request.requests_.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
  request.requests_.clear();
}

template <class T>
void Communicator::sendrecv(const T* send, T* recv, int64_t n, int dest, int source, int tag) {
  Request r = irecv(recv, n, source, tag);
  Request s = isend(send, n, dest, tag);
  wait(r);
  wait(s);
}

void Communicator::barrier() {
  Timed timed(stats_);
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

Share share_of(int64_t count, int ranks, int rank) {
  const int64_t base = count / ranks, extra = count % ranks;
  Share s;
  s.count = base + (rank < extra ? 1 : 0);
  s.begin = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

#define MULTIHEAD_COMM_INSTANTIATE(T)                                                   \
  template void Communicator::all_reduce_sum<T>(T*, int64_t);                           \
  template void Communicator::all_reduce_max<T>(T*, int64_t);                           \
  template void Communicator::broadcast<T>(T*, int64_t, int);                           \
  template void Communicator::all_gather<T>(const T*, T*, int64_t);                     \
  template void Communicator::all_to_all<T>(const T*, T*, int64_t);                     \
  template Request Communicator::isend<T>(const T*, int64_t, int, int);                 \
  template Request Communicator::irecv<T>(T*, int64_t, int, int);                       \
  template void Communicator::sendrecv<T>(const T*, T*, int64_t, int, int, int);
MULTIHEAD_COMM_INSTANTIATE(float)
MULTIHEAD_COMM_INSTANTIATE(double)
MULTIHEAD_COMM_INSTANTIATE(int64_t)
#undef MULTIHEAD_COMM_INSTANTIATE
template void Communicator::broadcast<uint8_t>(uint8_t*, int64_t, int);
template void Communicator::broadcast<int>(int*, int64_t, int);

}  // namespace multihead::distributed
