// tools/interrupts.hpp: SIGINT, SIGTERM and the other signals sent to end
// a process (SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU,
// SIGXFSZ: interrupts.cpp) never leave a temporary file.
//
// An output is written under a temporary name (NAME.tmp.XXXXXX) and renamed
// into place (write_files_atomic). The default action of such a signal
// ends the process wherever it is, so a signal between the temporary's
// creation and its rename left the temporary behind (issue 22, defect 2;
// SIGHUP and the rest, a hostile test of 2026-12-05: 13 of 30 runs).
// While a write is in progress (a DeferInterrupts is alive) the handler only
// records the signal; when the write has finished, renamed or removed, the
// signal is raised again with its default action, so the exit status is
// still "killed by SIGINT" (a shell's 130) and the output is complete. With
// no write in progress the handler raises it at once.
//
// A second signal during one write does not wait: it ends the process at
// once, as SIGKILL always does. Either can leave one NAME.tmp.XXXXXX next
// to each output being written (partial, never renamed); the outputs
// themselves hold their old bytes or their new ones, never a mix.
#pragma once

namespace multihead::cli {

// Installs the handler for those signals (a signal ignored when the program
// started, as SIGHUP under nohup or SIGINT for a background job, stays
// ignored). Call once, from main, before any work.
void install_interrupt_handlers();

// SIGBUS from an input file truncated in place while it is mapped
// (BUS_ADRERR inside multihead::address_in_mapped_input's ranges): one line,
// "an input file became shorter while it was read", and status 2 instead of
// a crash; any other SIGBUS goes to the handler that was installed before
// (Open MPI's, under a launcher: call this after MPI_Init) or its default.
void install_bus_error_handler();

// A scope in which those signals wait for the end of the scope.
class DeferInterrupts {
 public:
  DeferInterrupts();
  ~DeferInterrupts();
  DeferInterrupts(const DeferInterrupts&) = delete;
  DeferInterrupts& operator=(const DeferInterrupts&) = delete;
};

}  // namespace multihead::cli
