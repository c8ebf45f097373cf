// tools/mpi_session.cpp: see mpi_session.hpp.
#include "mpi_session.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace multihead::cli {

#if MULTIHEAD_WITH_MPI
namespace {

bool g_started = false;  // by this program (then it finalizes)
std::unique_ptr<distributed::Communicator> g_world;

bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void start(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error(Error::Kind::IO, "MPI_Init_thread: failed to start MPI");
  g_started = true;
}

}  // namespace

MpiSession::MpiSession(int& argc, char**& argv) {
  if (launched()) start(&argc, &argv);
}

MpiSession::~MpiSession() {
  g_world.reset();  // MPI_Comm_free, before MPI_Finalize
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_started && !finalized) MPI_Finalize();
}

distributed::Communicator& world_communicator() {
  if (!g_world) {
    start(nullptr, nullptr);
    g_world = std::make_unique<distributed::Communicator>(MPI_COMM_WORLD);
  }
  return *g_world;
}

int world_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return 1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Before the program's first message (no communicator yet) every rank ran
// the same checks on the same command line, so an error then is everyone's.
bool shared_by_all(const Error* e) {
  return !g_world || (e != nullptr && dynamic_cast<const AgreedError*>(e) != nullptr);
}

bool prints_error(const Error& e) { return !shared_by_all(&e) || world_rank() == 0; }

void throw_reworded(const Error& original, Error::Kind kind, const std::string& message) {
  if (const auto* agreed = dynamic_cast<const AgreedError*>(&original)) throw AgreedError(kind, message, agreed->origin());
  throw Error(kind, message);
}

int error_exit(const Error* error, int status) {
  if (!shared_by_all(error) && world_size() > 1) {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  return status;
}

void require_mpi(const std::string&, const std::string&) {}

#else

MpiSession::MpiSession(int&, char**&) {}
MpiSession::~MpiSession() = default;
int world_rank() { return 0; }
int world_size() { return 1; }
bool prints_error(const Error&) { return true; }
void throw_reworded(const Error&, Error::Kind kind, const std::string& message) { throw Error(kind, message); }
int error_exit(const Error*, int status) { return status; }

void require_mpi(const std::string& flag, const std::string& value) {
  throw Error(Error::Kind::Value, flag + ": this build has no MPI, so " + quote_input(value) +
                                      " cannot run (configure with -DMULTIHEAD_WITH_MPI=ON and Debian's "
                                      "libopenmpi-dev installed)");
}

#endif

}  // namespace multihead::cli
