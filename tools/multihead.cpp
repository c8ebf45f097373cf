// tools/multihead.cpp: the `multihead` command-line program.
//
//   multihead                 the lesson's demo (same as `multihead demo`)
//   multihead forward …       torch.nn.MultiheadAttention.forward on .npy files
//   multihead init …          write PyTorch-initialised weights (safetensors)
//   multihead bench …         time forward passes (median ms, GFLOP/s)
//
// Exit codes: 0 success, 2 bad usage or bad input (one line on stderr),
// 1 an unexpected internal failure.
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>

#include "commands.hpp"
#include "multihead/error.hpp"
#include "multihead/runtime.hpp"

namespace multihead::cli {

void apply_threads(int threads) {
  set_threads(threads);
}

}  // namespace multihead::cli

int main(int argc, char** argv) {
  using namespace multihead::cli;
  CLI::App app{"multihead: exact, fast multi-head attention (torch.nn.MultiheadAttention on the CPU)",
               "multihead"};
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  Runner forward = add_forward_command(app);
  Runner demo = add_demo_command(app);
  Runner init = add_init_command(app);
  Runner bench = add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "multihead: error: " << msg << " (run 'multihead --help')\n";
    return 2;
  }
  try {
    if (app.got_subcommand("forward")) forward();
    else if (app.got_subcommand("demo")) demo();
    else if (app.got_subcommand("init")) init();
    else if (app.got_subcommand("bench")) bench();
    else run_default_demo();
  } catch (const multihead::Error& e) {
    std::cerr << "multihead: error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "multihead: error: out of memory\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "multihead: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
