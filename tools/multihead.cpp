// tools/multihead.cpp: the `multihead` command-line program.
//
//   multihead                 a short usage: the commands, one line each
//   multihead forward …       torch.nn.MultiheadAttention.forward on .npy files
//   multihead init …          write PyTorch-initialised weights (safetensors)
//   multihead bench …         time forward passes (median ms, GFLOP/s)
//   multihead inspect FILE    tensors, metadata and attention modules of a file
//   multihead demo …          the lesson's sentence, head by head
//   multihead explain …       what each head attends to: HTML report, text view, bertviz JSON
//   multihead train …         train a small Transformer encoder on a built-in task
//   multihead decode …        generate with a KV cache (grouped-query module): tokens/s, cache bytes
//   multihead experiment …    what several heads gain over one, measured
//   multihead ablate …        which heads a trained model needs: importance, masking, pruning
//   multihead --version       "multihead 0.1.0"
//
// Every subcommand gets, from cli_manners: defaults in --help, enum values in
// any case, and parse errors with "did you mean" and a pointer to its own
// --help. Files named by flags are checked by file_flags before any work.
//
// Exit codes: 0 success, 2 bad usage or bad input (one line on stderr),
// 1 an unexpected internal failure.
//
// Under mpirun (tools/mpi_session.hpp) every rank runs this main; an error
// all ranks agreed on is printed by rank 0 only.
#include <cerrno>
#include <cstdio>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <new>
#include <string>
#include <system_error>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "interrupts.hpp"
#include "mpi_session.hpp"
#include "parallel.hpp"
#include "multihead/error.hpp"
#include "multihead/version.hpp"
#include "multihead/runtime.hpp"

namespace multihead::cli {

void apply_threads(int threads) {
  if (threads > max_threads())
    throw Error(Error::Kind::Value, "--threads: expected at most " + std::to_string(max_threads()) +
                                        " (8 per processor), got " + std::to_string(threads));
  set_threads(threads);
}

namespace {

// Whatever was printed on standard output (help, inspect's table, the demo)
// must have arrived: `multihead inspect w > /dev/full` fails, it does not
// exit 0 with nothing written. Returns the exit status to use.
int flushed(int status) {
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!failed || status != 0) return status;
  const int err = errno;
  std::fprintf(stderr, "multihead: error: cannot write standard output: %s\n",
               err != 0 ? std::generic_category().message(err).c_str() : "write error");
  return 2;
}

}  // namespace

}  // namespace multihead::cli

int main(int argc, char** argv) {
  using namespace multihead::cli;
  install_interrupt_handlers();
  const MpiSession mpi(argc, argv);  // MPI_Init under a launcher; MPI_Finalize on return
  install_bus_error_handler();       // after MPI_Init: Open MPI's SIGBUS handler stays behind ours
  CLI::App app{"multihead: exact, fast multi-head attention (torch.nn.MultiheadAttention on the CPU)",
               "multihead"};
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  app.set_version_flag("--version", std::string("multihead ") + multihead::version(), "Print the version and exit");
  show_defaults(app);  // before the subcommands, which inherit it
  Runner forward = add_forward_command(app);
  Runner demo = add_demo_command(app);
  Runner init = add_init_command(app);
  Runner bench = add_bench_command(app);
  Runner inspect = add_inspect_command(app);
  Runner explain = add_explain_command(app);
  Runner train = add_train_command(app);
  Runner decode = add_decode_command(app);
  Runner experiment = add_experiment_command(app);
  Runner ablate = add_ablate_command(app);
  if (argc <= 1) {
    std::cout << usage(app);
    return flushed(0);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return flushed(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return flushed(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return flushed(app.exit(e));
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same command line: rank 0 says what is wrong.
    if (world_rank() == 0) std::cerr << "multihead: error: " << cut_long_words(describe_parse_error(app, e)) << "\n";
    return 2;
  }
  try {
    // Every tuning variable before any work, whatever the command reads.
    // Under mpirun every rank sees the same variables: one line, from rank 0.
    if (!app.get_subcommands().empty())
      agree_on(world_size() > 1 ? "environment" : "", [] { multihead::check_environment(); });
    // The library names its fields (num_heads, d_model); each command's
    // errors say the flags that set them (--num-heads, --d-model).
    const std::vector<FieldFlag> training = {{"vocabulary", "--symbols"},
                                             {"sequence_length", "--length"},
                                             {"eps", "--adam-eps"},
                                             {"positional_encoding", "--positions"}};
    // Where a file may set a field (the weights' metadata, a checkpoint),
    // only the flags given are named.
    const auto run = [&app](const char* name, const Runner& command, std::vector<FieldFlag> extra = {}) {
      const CLI::App& sub = *app.get_subcommand(name);
      bool files = false;
      for (const char* flag : {"--weights", "--resume", "--model"})
        files = files || (sub.get_option_no_throw(flag) != nullptr && sub.get_option(flag)->count() > 0);
      as_flags(fields_of(sub, !files && name != std::string("forward") && name != std::string("explain"),
                         std::move(extra)),
               command);
    };
    if (app.got_subcommand("forward")) run("forward", forward);
    else if (app.got_subcommand("demo")) run("demo", demo);
    else if (app.got_subcommand("init")) run("init", init);
    else if (app.got_subcommand("bench")) run("bench", bench);
    else if (app.got_subcommand("inspect")) run("inspect", inspect);
    else if (app.got_subcommand("explain")) run("explain", explain);
    else if (app.got_subcommand("train")) {
      // lesson and lookup2 have their own vocabulary and length: --symbols
      // and --length set nothing there.
      const std::string task = app.get_subcommand("train")->get_option("--task")->as<std::string>();
      std::vector<FieldFlag> extra = training;
      if (task == "lesson" || task == "lookup2")
        std::erase_if(extra, [](const FieldFlag& f) { return f.flag == "--symbols" || f.flag == "--length"; });
      run("train", train, std::move(extra));
    }
    else if (app.got_subcommand("decode")) run("decode", decode);
    else if (app.got_subcommand("experiment")) run("experiment", experiment);
    else if (app.got_subcommand("ablate")) run("ablate", ablate);
    else std::cout << usage(app);
  } catch (const multihead::Error& e) {
    if (prints_error(e)) std::cerr << "multihead: error: " << cut_long_words(e.what()) << "\n";
    return error_exit(&e, 2);
  } catch (const std::bad_alloc&) {
    std::cerr << "multihead: error: out of memory\n";
    return error_exit(nullptr, 2);
  } catch (const std::length_error&) {
    // A container asked for more elements than it can hold (a size flag such
    // as --embed-dim 2147483648): the same resource limit as bad_alloc.
    std::cerr << "multihead: error: out of memory (a buffer beyond what this machine can address was asked for: "
                 "check the size flags)\n";
    return error_exit(nullptr, 2);
  } catch (const std::exception& e) {
    std::cerr << "multihead: internal error: " << cut_long_words(e.what()) << "\n";
    return error_exit(nullptr, 1);
  }
  return flushed(0);
}
