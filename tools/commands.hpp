// tools/commands.hpp: the subcommands of the `multihead` program. Each
// add_*_command registers its options on the app and returns the function
// that runs it; main() owns exit codes (0 ok, 2 bad usage or bad input).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace multihead::cli {

using Runner = std::function<void()>;

Runner add_forward_command(CLI::App& app);
Runner add_demo_command(CLI::App& app);
Runner add_init_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_inspect_command(CLI::App& app);
Runner add_explain_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_decode_command(CLI::App& app);
Runner add_experiment_command(CLI::App& app);
Runner add_ablate_command(CLI::App& app);

// The end of a refusal of a training run past the machine's memory
// (check_training_fits), in the flags of train, experiment and ablate --grid.
inline constexpr const char* kTrainingMemoryHint = "a lower bound; lower --batch, --d-model or --layers";

// --threads for both our OpenMP loops and BLAS (the program owns the process,
// so it may set BLAS's global thread count; the library never does).
void apply_threads(int threads);

}  // namespace multihead::cli
