// tests/distributed/mpi_test_main.cpp: the MPI test binary's driver. One
// mpirun per rank count runs every case of every table (tests/distributed/
// mpi_*_cases.cpp) inside one MPI job, since starting mpirun costs ~0.5 s.
//
//   mpirun -np P multihead_mpi_tests [FILTER]   cases whose name contains FILTER
//
// A case runs on every rank; it fails when any rank reports a failure (the
// ranks agree through an all-reduce), and rank 0 prints each case's name,
// "ok" or every failure line. Exit 0 when every case passed on every rank.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "mpi_test.hpp"

namespace multihead::mpi_test {

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

Register::Register(const char* table, std::vector<Case> (*make)()) {
  for (Case& c : make()) {
    c.name = std::string(table) + "/" + c.name;
    registry().push_back(std::move(c));
  }
}

}  // namespace multihead::mpi_test

int main(int argc, char** argv) {
  using namespace multihead;
  using namespace multihead::mpi_test;
  MPI_Init(&argc, &argv);
  int failures = 0, run = 0;
  {
    distributed::Communicator comm(MPI_COMM_WORLD);
    const std::string filter = argc > 1 ? argv[1] : "";
    for (const Case& c : registry()) {
      if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
      if (c.min_ranks > comm.size()) continue;
      ++run;
      Report report;
      try {
        c.run(comm, report);
      } catch (const std::exception& e) {
        report.fail(std::string("threw: ") + e.what());
      }
      // Every rank's failures reach rank 0, in rank order.
      int64_t mine = static_cast<int64_t>(report.lines.size()), any = mine;
      comm.all_reduce_max(&any, 1);
      if (any == 0) {
        if (comm.rank() == 0) std::printf("ok    %s\n", c.name.c_str());
        continue;
      }
      ++failures;
      std::string text;
      for (const std::string& line : report.lines) text += "  rank " + std::to_string(comm.rank()) + ": " + line + "\n";
      int64_t length = static_cast<int64_t>(text.size());
      std::vector<int64_t> lengths(static_cast<std::size_t>(comm.size()));
      comm.all_gather(&length, lengths.data(), 1);
      if (comm.rank() == 0) {
        std::printf("FAIL  %s\n%s", c.name.c_str(), text.c_str());
        for (int r = 1; r < comm.size(); ++r) {
          std::string other(static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]), '\0');
          MPI_Recv(other.data(), static_cast<int>(other.size()), MPI_CHAR, r, 7, comm.comm(), MPI_STATUS_IGNORE);
          std::printf("%s", other.c_str());
        }
      } else {
        MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, 7, comm.comm());
      }
    }
    if (comm.rank() == 0)
      std::printf("%d of %d cases passed on %d ranks\n", run - failures, run, comm.size());
    std::fflush(stdout);
  }
  MPI_Finalize();
  return failures == 0 && run > 0 ? 0 : 1;
}
