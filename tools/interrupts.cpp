// tools/interrupts.cpp: see interrupts.hpp.
//
// One atomic word holds the state, so that the handler (on whichever thread
// the kernel picks, an OpenMP worker included) and the writer agree without
// a lock: the low 16 bits count the writes in progress, the bits above hold
// the signal that arrived during one (0 = none). Lock-free atomics are
// async-signal-safe, and so are signal(2) and raise(3).
#include "interrupts.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "multihead/io.hpp"

namespace multihead::cli {
namespace {

constexpr unsigned kCountMask = 0xffffu;
constexpr unsigned kSignalShift = 16;

// The signals a user, a terminal, a shell, a batch system or a resource
// limit sends to end a process (each ends it by default). Not deferred: the
// profiling timers (SIGPROF, SIGVTALRM), the synchronous faults (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS: a bug, where deferring would only
// run on in a broken state), and signals nobody sends to stop a job
// (SIGIO/SIGPOLL, SIGPWR, SIGSTKFLT, the real-time signals). SIGPIPE and SIGXFSZ
// arrive during a write itself; deferred, the write fails with EPIPE or
// EFBIG instead, its temporary is removed, and the signal is raised after.
constexpr int kDeferredSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGPIPE, SIGALRM,
                                    SIGUSR1, SIGUSR2, SIGXCPU, SIGXFSZ};

std::atomic<unsigned> g_state{0};
static_assert(std::atomic<unsigned>::is_always_lock_free);

// The default action: for each of kDeferredSignals, the end of the process
// (SIGQUIT and SIGXCPU, SIGXFSZ with a core file where the limits allow
// one), with the status a shell reports as killed by that signal.
void raise_default(int sig) {
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void on_interrupt(int sig) {
  unsigned s = g_state.load();
  for (;;) {
    // No write in progress, or a second signal during one: now.
    if ((s & kCountMask) == 0 || (s >> kSignalShift) != 0) return raise_default(sig);
    if (g_state.compare_exchange_weak(s, s | (static_cast<unsigned>(sig) << kSignalShift))) return;
  }
}

// SIGBUS with BUS_ADRERR at an address inside a mapped input
// (multihead::address_in_mapped_input: src/io maps .npy and safetensors
// files): a page of an input truncated in place by another program while
// it was read. One line and status 2, as any bad input, rather than a
// crash; write(2) and _exit(2) are async-signal-safe. Any other SIGBUS (a
// full /dev/shm under Open MPI, a bug) goes to the handler installed before
// ours, or keeps its default action.
struct sigaction g_previous_bus {};  // the handler before ours (Open MPI's stack trace, under a launcher)

void on_bus_error(int sig, siginfo_t* info, void* context) {
  if (info != nullptr && info->si_code == BUS_ADRERR && multihead::address_in_mapped_input(info->si_addr)) {
    static const char kMessage[] =
        "multihead: error: an input file became shorter while it was read (another program truncated or rewrote "
        "it in place); nothing was written\n";
    const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)ignored;
    ::_exit(2);
  }
  // Any other SIGBUS: the handler that was there before (if one), else the
  // default action.
  if ((g_previous_bus.sa_flags & SA_SIGINFO) != 0 && g_previous_bus.sa_sigaction != nullptr)
    return g_previous_bus.sa_sigaction(sig, info, context);
  if ((g_previous_bus.sa_flags & SA_SIGINFO) == 0 && g_previous_bus.sa_handler != SIG_DFL &&
      g_previous_bus.sa_handler != SIG_IGN && g_previous_bus.sa_handler != nullptr)
    return g_previous_bus.sa_handler(sig);
  raise_default(sig);
}

}  // namespace

void install_bus_error_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_bus_error;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, &g_previous_bus);
}

void install_interrupt_handlers() {
  for (int sig : kDeferredSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a deferred signal must not fail the write with EINTR
    ::sigaction(sig, &sa, nullptr);
  }
}

DeferInterrupts::DeferInterrupts() { g_state.fetch_add(1); }

DeferInterrupts::~DeferInterrupts() {
  unsigned s = g_state.load();
  while (!g_state.compare_exchange_weak(s, (s & kCountMask) == 1 ? 0 : s - 1)) {
  }
  // The last write out takes the recorded signal with it and raises it.
  if ((s & kCountMask) == 1 && (s >> kSignalShift) != 0) raise_default(static_cast<int>(s >> kSignalShift));
}

}  // namespace multihead::cli
