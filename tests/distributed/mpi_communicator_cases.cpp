// tests/distributed/mpi_communicator_cases.cpp: the Communicator's collectives
// against what they promise, on the ranks the job has.
#include <cstring>
#include <random>

#include "mpi_test.hpp"

namespace multihead::mpi_test {
namespace {

using distributed::Communicator;

// Rank r's values: a fixed pseudo-random function of (r, i), wide-ranging, so
// that a different order of additions gives different bits.
double value_of(int rank, int64_t i) {
  std::mt19937_64 g(static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(i));
  return std::ldexp(std::uniform_real_distribution<double>(-1, 1)(g), static_cast<int>(g() % 40) - 20);
}

template <class T>
void all_reduce_in_rank_order(Communicator& comm, Report& report, int64_t n) {
  std::vector<T> data(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) data[static_cast<std::size_t>(i)] = static_cast<T>(value_of(comm.rank(), i));
  comm.all_reduce_sum(data.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    T want = static_cast<T>(value_of(0, i));
    for (int r = 1; r < comm.size(); ++r) want += static_cast<T>(value_of(r, i));
    if (std::memcmp(&want, &data[static_cast<std::size_t>(i)], sizeof(T)) != 0) {
      report.fail("all_reduce_sum[" + std::to_string(i) + "]: got " + std::to_string(data[i]) +
                  ", expected the rank-order sum " + std::to_string(want) + " bit for bit");
      return;
    }
  }
}

void agree_names_first_failing_rank(Communicator& comm, Report& report) {
  const int bad = comm.size() / 2;  // one rank fails, the others pass
  for (int round = 0; round < 2; ++round) {
    try {
      comm.agree([&] {
        if (round == 1 && comm.rank() >= bad)
          throw Error(Error::Kind::Shape, "query: bad on rank " + std::to_string(comm.rank()));
      });
      if (round == 1) report.fail("agree: returned although rank " + std::to_string(bad) + " failed");
    } catch (const AgreedError& e) {
      const std::string want = "query: bad on rank " + std::to_string(bad);
      if (round == 0) report.fail(std::string("agree: threw with no failure: ") + e.what());
      else if (e.what() != want || e.origin() != bad || e.kind() != Error::Kind::Shape)
        report.fail(std::string("agree: got '") + e.what() + "' from rank " + std::to_string(e.origin()) +
                    ", expected '" + want + "' from rank " + std::to_string(bad));
    }
  }
}

void ring_and_all_to_all(Communicator& comm, Report& report) {
  const int P = comm.size(), r = comm.rank();
  const int64_t n = 5;
  std::vector<double> send(n), recv(n, -1);
  for (int64_t i = 0; i < n; ++i) send[i] = 100 * r + i;
  comm.sendrecv(send.data(), recv.data(), n, (r + 1) % P, (r + P - 1) % P, 3);
  for (int64_t i = 0; i < n; ++i)
    if (recv[i] != 100 * ((r + P - 1) % P) + i) report.fail("sendrecv: got " + std::to_string(recv[i]));
  std::vector<double> a(static_cast<std::size_t>(n * P)), b(a.size());
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < n; ++i) a[j * n + i] = 1000 * r + 10 * j + i;
  comm.all_to_all(a.data(), b.data(), n);
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < n; ++i)
      if (b[j * n + i] != 1000 * j + 10 * r + i) report.fail("all_to_all: block " + std::to_string(j) + " wrong");
}

void shares_cover_in_order(Communicator&, Report& report) {
  for (int64_t count : {1, 5, 7, 16})
    for (int P = 1; P <= 6; ++P) {
      int64_t next = 0;
      for (int r = 0; r < P; ++r) {
        const distributed::Share s = distributed::share_of(count, P, r);
        const int64_t want = count / P + (r < count % P ? 1 : 0);
        if (s.begin != next || s.count != want)
          report.fail("share_of(" + std::to_string(count) + ", " + std::to_string(P) + ", " + std::to_string(r) +
                      "): got [" + std::to_string(s.begin) + ", +" + std::to_string(s.count) + ")");
        next = s.end();
      }
    }
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  for (int64_t n : {1, 7, 1000}) {
    cases.push_back({"all_reduce_sum_rank_order/float/n=" + std::to_string(n),
                     [n](Communicator& c, Report& r) { all_reduce_in_rank_order<float>(c, r, n); }});
    cases.push_back({"all_reduce_sum_rank_order/double/n=" + std::to_string(n),
                     [n](Communicator& c, Report& r) { all_reduce_in_rank_order<double>(c, r, n); }});
  }
  cases.push_back({"agree_names_first_failing_rank", agree_names_first_failing_rank});
  cases.push_back({"sendrecv_ring_and_all_to_all", ring_and_all_to_all});
  cases.push_back({"share_of_covers_in_order", shares_cover_in_order});
  return cases;
}

}  // namespace

MULTIHEAD_MPI_CASES(communicator, make_cases);

}  // namespace multihead::mpi_test
