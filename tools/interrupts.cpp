// tools/interrupts.cpp: see interrupts.hpp.
//
// One atomic word holds the state, so that the handler (on whichever thread
// the kernel picks, an OpenMP worker included) and the writer agree without
// a lock: the low 16 bits count the writes in progress, the bits above hold
// the signal that arrived during one (0 = none). Lock-free atomics are
// async-signal-safe, and so are signal(2) and raise(3).
#include "interrupts.hpp"

#include <signal.h>

#include <atomic>

namespace multihead::cli {
namespace {

constexpr unsigned kCountMask = 0xffffu;
constexpr unsigned kSignalShift = 16;

std::atomic<unsigned> g_state{0};
static_assert(std::atomic<unsigned>::is_always_lock_free);

// The default action: for SIGINT and SIGTERM, the end of the process, with
// the status a shell reports as killed by that signal.
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

}  // namespace

void install_interrupt_handlers() {
  for (int sig : {SIGINT, SIGTERM}) {
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
