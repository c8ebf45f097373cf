// tools/mpi_session.hpp: the program's MPI (the library never starts MPI).
//
// main() holds one MpiSession. Under a launcher (mpirun sets
// OMPI_COMM_WORLD_SIZE, PMIx launchers PMIX_RANK, others PMI_RANK) it calls
// MPI_Init_thread (FUNNELED: OpenMP threads compute, only the main thread
// calls MPI) at once and MPI_Finalize when main returns. Without a launcher
// nothing starts, so a plain run costs nothing; a --parallel command then
// starts MPI as a singleton: one rank, the same result.
//
// Built without MPI (MULTIHEAD_WITH_MPI unset), --parallel is refused with
// one line saying so (require_mpi), and every rank query answers "rank 0 of 1".
#pragma once

#include <string>

#include "multihead/error.hpp"
#if MULTIHEAD_WITH_MPI
#include "multihead/distributed.hpp"
#endif

namespace multihead::cli {

class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// This process's rank in the world and the world's size: 0 and 1 without MPI
// or before it started.
int world_rank();
int world_size();

// Whether this rank prints `e` (main's catch): an error every rank agreed on
// (AgreedError), or one before the program's first message (every rank
// checks the same command line), is printed by rank 0 only; any other by the
// rank it happened on.
bool prints_error(const Error& e);

// Throws an Error with this kind and message, as agreed as `original` was
// (an AgreedError stays one): for a command that rewords a library message.
[[noreturn]] void throw_reworded(const Error& original, Error::Kind kind, const std::string& message);

// How main() ends after an error it printed: `status`, except that an error
// only this rank had (not agreed, after the first message), with other ranks
// running, aborts the whole job (MPI_Abort): they may be waiting for this
// rank in a collective.
int error_exit(const Error* error, int status);

// Throws "FLAG: this build has no MPI …" unless the program was built with
// MPI. `value` is what the flag was given ("heads").
void require_mpi(const std::string& flag, const std::string& value);

#if MULTIHEAD_WITH_MPI
// The world's communicator (MPI_COMM_WORLD duplicated, once per process),
// starting MPI as a singleton first if no launcher did.
distributed::Communicator& world_communicator();
#endif

}  // namespace multihead::cli
