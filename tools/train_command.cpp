// tools/train_command.cpp: `multihead train`, the small Transformer encoder
// of multihead/train.hpp trained on a built-in task.
//
// Standard output carries the progress: on a terminal one bar redrawn in
// place (step, loss, accuracy, tokens/s, time left); otherwise a plain line
// every --log-interval steps, key=value pairs that a script can split:
//   step=20 loss=1.8734 accuracy=0.4123 lr=0.001 grad_norm=0.8812 tokens_per_s=51234 elapsed_s=0.31
// (with --dtype f16 two more pairs, the loss scale of the last step and the
// steps skipped so far: "… elapsed_s=0.31 loss_scale=65536 skipped=0"),
// and, either way, a final summary line starting "done:".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "mpi_session.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/narrow.hpp"
#include "multihead/train.hpp"
#if MULTIHEAD_WITH_MPI
#include "multihead/data_parallel.hpp"
#endif

namespace multihead::cli {
namespace {

struct TrainArgs {
  std::string task = "reverse";
  int64_t symbols = 10, length = 8;
  ModelConfig model;
  TrainOptions train;
  std::string schedule = "cosine";
  std::string positions = "sinusoidal";
  std::string checkpoint_out, resume, dump_gradients;
  int64_t checkpoint_every = 0, log_interval = 10;
  std::string progress = "auto";
  std::string parallel;  // "" or "data"
  std::string dtype = "f32";
};

std::string clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tokens_per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tokens_per_s);
  return buf;
}

// The progress of a run: a bar on a terminal, lines elsewhere.
class Progress {
 public:
  // scaled: the run scales its loss (f16), so the lines say the scale and the skipped steps.
  Progress(bool bar, int64_t first, int64_t last, int64_t interval, bool scaled)
      : bar_(bar), scaled_(scaled), first_(first), last_(last), interval_(interval),
        start_(std::chrono::steady_clock::now()) {}

  // quiet: count the tokens only (--progress none).
  void report(const StepStats& s, bool quiet) {
    tokens_ += s.tokens;
    skipped_ += s.skipped ? 1 : 0;
    if (quiet) return;
    const double elapsed = seconds();
    const int64_t done = s.step + 1 - first_, left = last_ - (s.step + 1);
    const double tps = elapsed > 0 ? double(tokens_) / elapsed : 0.0;
    if (bar_) {
      // Redraw at most ~20 times a second, and always for the last step.
      if (left > 0 && elapsed - drawn_ < 0.05) return;
      drawn_ = elapsed;
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * double(s.step + 1) / double(std::max<int64_t>(last_, 1)));
      std::string bar(static_cast<std::size_t>(filled), '#');
      bar.resize(kWidth, '-');
      std::printf("\r\033[Kstep %lld/%lld [%s] loss %.4f acc %5.1f%% %s tok/s %s left",
                  static_cast<long long>(s.step + 1), static_cast<long long>(last_), bar.c_str(), s.loss,
                  100.0 * s.accuracy, rate(tps).c_str(), clock(elapsed / double(done) * double(left)).c_str());
      std::fflush(stdout);
      if (left == 0) std::printf("\n");
      return;
    }
    if ((s.step + 1) % interval_ != 0 && left > 0) return;
    std::printf("step=%lld loss=%.9g accuracy=%.4f lr=%.6g grad_norm=%.6g tokens_per_s=%.0f elapsed_s=%.3f",
                static_cast<long long>(s.step + 1), s.loss, s.accuracy, s.lr, s.grad_norm, tps, elapsed);
    if (scaled_) std::printf(" loss_scale=%.17g skipped=%lld", s.loss_scale, static_cast<long long>(skipped_));
    std::printf("\n");
    std::fflush(stdout);
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  int64_t tokens() const { return tokens_; }
  int64_t skipped() const { return skipped_; }

 private:
  bool bar_, scaled_;
  int64_t first_, last_, interval_;
  std::chrono::steady_clock::time_point start_;
  int64_t tokens_ = 0, skipped_ = 0;
  double drawn_ = -1;
};

// The first batch's inputs, loss and every gradient (and the model's
// settings), for tests/train/torch_model.py to recompute in PyTorch.
std::string gradient_file(const Trainer& t) {
  const Batch b = t.current_batch();
  const GradientDump d = t.gradients();
  std::map<std::string, Tensor<float>> tensors;
  auto ids = [&](const auto& v) {
    Tensor<float> out({b.batch, b.length});
    for (std::size_t i = 0; i < v.size(); ++i) out[static_cast<int64_t>(i)] = static_cast<float>(v[i]);
    return out;
  };
  tensors["tokens"] = ids(b.tokens);
  tensors["targets"] = ids(b.targets);
  tensors["mask"] = ids(b.mask);
  for (const auto& [name, g] : d.gradients) tensors["grad." + name] = g;
  return serialize_safetensors(tensors, {{"format", "multihead-train-gradients-1"},
                                         {"loss", to_exact_string(d.loss)},
                                         {"accuracy", to_exact_string(d.accuracy)},
                                         {"step", std::to_string(t.step())}});
}

// Every flag and file checked, the trainer built (or resumed): no
// communication, so under mpirun every rank runs it inside agree().
std::unique_ptr<Trainer> make_trainer(TrainArgs& a, const CLI::App& c) {
  for (const auto& [flag, path] : {std::pair<const char*, std::string&>{"--checkpoint-out", a.checkpoint_out},
                                   {"--dump-gradients", a.dump_gradients}})
    if (is_stdout(path))
      throw Error(Error::Kind::Value, std::string(flag) +
                                          ": expected a file path, got '-' (standard output carries the progress)");
  check_files({{"--resume", a.resume}}, {{"--checkpoint-out", a.checkpoint_out}, {"--dump-gradients", a.dump_gradients}});
  apply_threads(a.train.threads);
  // Flags that would change nothing in this combination (issue 22).
  auto given = [&](const char* flag) { return c.get_option(flag)->count() > 0; };
  if (a.checkpoint_every > 0 && a.checkpoint_out.empty())
    throw Error(Error::Kind::Value, "--checkpoint-every: needs --checkpoint-out (the file to write every N steps)");
  if (a.resume.empty() && (a.task == "lesson" || a.task == "lookup2"))
    for (const char* flag : {"--symbols", "--length"})
      if (given(flag))
        throw Error(Error::Kind::Value, std::string(flag) + ": not used with --task " + a.task +
                                            " (the task has its own vocabulary and length)");
  a.train.schedule = parse_schedule(a.schedule);
  a.train.gradients = a.parallel.empty() ? GradientSum::Batched : GradientSum::PerExample;
  a.model.positions = parse_positions(a.positions, "--positions");
  a.train.dtype = parse_compute_dtype(a.dtype, "--dtype");
  if (given("--dtype") && a.train.dtype != ComputeDtype::F32 && !a.parallel.empty())
    throw Error(Error::Kind::Value, "--dtype: --parallel data trains in f32 only, got --dtype " + a.dtype);
  if (a.resume.empty() && a.model.d_model % a.model.heads != 0)
    throw Error(Error::Kind::Value, "--heads: expected a divisor of --d-model " + std::to_string(a.model.d_model) +
                                        ", got " + std::to_string(a.model.heads));

  std::unique_ptr<Trainer> trainer;
  if (a.resume.empty()) {
    const std::shared_ptr<const Task> task = make_task(a.task, a.symbols, a.length);
    ModelConfig sized = a.model;
    sized.vocabulary = task->vocabulary();
    sized.sequence_length = task->sequence_length();
    sized.validate();
    check_training_fits(sized, a.train, a.task == "lesson" || a.task == "lookup2"
                                            ? kTrainingMemoryHint
                                            : "a lower bound; lower --batch, --length, --d-model or --layers");
    trainer = std::make_unique<Trainer>(task, a.model, a.train);
  } else {
    // The checkpoint's settings, except where a flag was given: a given
    // flag that differs is refused by resume (the run would not continue
    // the same way).
    try {
      const CheckpointInfo ck = read_checkpoint_info(a.resume);
      ModelConfig m = ck.model;
      TrainOptions o = ck.options;
      std::string task = ck.task;
      int64_t symbols = m.vocabulary, length = m.sequence_length;
      if (given("--task")) task = a.task;
      if (given("--symbols")) symbols = a.symbols;
      if (given("--length")) length = a.length;
      if (given("--d-model")) m.d_model = a.model.d_model;
      if (given("--heads")) m.heads = a.model.heads;
      if (given("--layers")) m.layers = a.model.layers;
      if (given("--ff")) m.ff = a.model.ff;
      if (given("--dropout")) m.dropout = a.model.dropout;
      if (given("--causal")) m.causal = a.model.causal;
      if (given("--positions")) m.positions = a.model.positions;
      if (given("--batch")) o.batch = a.train.batch;
      if (given("--lr")) o.lr = a.train.lr;
      if (given("--warmup")) o.warmup = a.train.warmup;
      if (given("--schedule")) o.schedule = a.train.schedule;
      if (given("--weight-decay")) o.weight_decay = a.train.weight_decay;
      if (given("--beta1")) o.beta1 = a.train.beta1;
      if (given("--beta2")) o.beta2 = a.train.beta2;
      if (given("--adam-eps")) o.eps = a.train.eps;
      if (given("--clip")) o.clip = a.train.clip;
      if (given("--seed")) o.seed = a.train.seed;
      if (given("--dtype")) o.dtype = a.train.dtype;
      o.steps = given("--steps") ? a.train.steps : ck.options.steps;
      o.threads = a.train.threads;
      o.gradients = a.train.gradients;  // resume refuses a checkpoint summed the other way
      m.vocabulary = 0;  // the task's (a different --symbols is then named by resume)
      m.sequence_length = 0;
      const std::shared_ptr<const Task> t = make_task(task, symbols, length);
      trainer = std::make_unique<Trainer>(Trainer::resume(a.resume, t, m, o));
    } catch (const Error& e) {
      throw Error(e.kind(), "--resume: " + std::string(e.what()));
    }
  }

  return trainer;
}

// How the run's steps are taken and its files written: in this process,
// or (--parallel data under MPI) as one rank of several, rank 0 printing
// and writing.
struct Ranks {
  int rank = 0, size = 1;
  std::function<StepStats(Trainer&)> step = [](Trainer& t) { return t.train_step(); };
  // Runs `write` on rank 0, and every rank learns whether it failed.
  std::function<void(const std::function<void()>&)> on_rank0 = [](const std::function<void()>& write) { write(); };
  // An error every rank meets at once (a diverged loss: the same on every rank).
  std::function<Error(Error::Kind, const std::string&)> common_error = [](Error::Kind k, const std::string& m) {
    return Error(k, m);
  };
};

void run_train(TrainArgs& a, const CLI::App& c) {
  std::unique_ptr<Trainer> trainer;
  Ranks ranks;
  if (a.parallel.empty()) {
    trainer = make_trainer(a, c);
  } else {
    require_mpi("--parallel", a.parallel);
#if MULTIHEAD_WITH_MPI
    distributed::Communicator& comm = world_communicator();
    comm.agree([&] {
      trainer = make_trainer(a, c);
      distributed::check_data_parallel(*trainer, comm.size());
    });
    ranks.rank = comm.rank();
    ranks.size = comm.size();
    ranks.step = [&comm](Trainer& t) { return distributed::data_parallel_step(t, comm); };
    ranks.on_rank0 = [&comm](const std::function<void()>& write) {
      comm.agree([&] {
        if (comm.rank() == 0) write();
      });
    };
    ranks.common_error = [](Error::Kind k, const std::string& m) { return AgreedError(k, m, 0); };
#endif
  }
  // The gradients are of the first batch, before any step; the file is
  // written with the final checkpoint, so that a run that fails (diverges,
  // is interrupted) leaves the old one as it was.
  std::string gradients;
  if (!a.dump_gradients.empty()) ranks.on_rank0([&] { gradients = gradient_file(*trainer); });

  const TrainOptions& o = trainer->options();
  const ModelConfig& m = trainer->model_config();
  const bool bar = a.progress == "bar" || (a.progress == "auto" && ::isatty(STDOUT_FILENO));
  const int64_t first = trainer->step();
  if (const std::string note = compute_dtype_note(o.dtype); !note.empty() && ranks.rank == 0)
    std::fprintf(stderr, "multihead: note: --dtype %s: %s\n", to_string(o.dtype).c_str(), note.c_str());
  Progress progress(bar, first, o.steps, a.log_interval, o.dtype == ComputeDtype::F16);
  StepStats first_stats, last_stats;
  const bool quiet = a.progress == "none" || ranks.rank != 0;
  const auto checkpoint = [&] {
    ranks.on_rank0([&] { write_outputs({{{"--checkpoint-out", a.checkpoint_out}, trainer->serialize_checkpoint()}}); });
  };
  while (trainer->step() < o.steps) {
    const StepStats s = ranks.step(*trainer);
    if (s.step == first) first_stats = s;
    last_stats = s;
    if (!std::isfinite(s.loss))
      throw ranks.common_error(Error::Kind::Value, "training diverged: loss " + std::to_string(s.loss) +
                                                       " at step " + std::to_string(s.step + 1) +
                                                       " (try a smaller --lr)");
    progress.report(s, quiet);
    if (a.checkpoint_every > 0 && !a.checkpoint_out.empty() && trainer->step() % a.checkpoint_every == 0 &&
        trainer->step() < o.steps)
      checkpoint();
  }
  ranks.on_rank0([&] {
    std::vector<Output> outputs;
    if (!a.dump_gradients.empty()) outputs.push_back({{"--dump-gradients", a.dump_gradients}, std::move(gradients)});
    if (!a.checkpoint_out.empty())
      outputs.push_back({{"--checkpoint-out", a.checkpoint_out}, trainer->serialize_checkpoint()});
    if (!outputs.empty()) write_outputs(std::move(outputs));
  });
  if (ranks.rank != 0) return;

  int64_t parameters = 0;
  for (const auto& [name, t] : trainer->parameters()) parameters += t.numel();
  const double seconds = progress.seconds();
  std::printf("done: %s, %lld layers, d_model %lld, %lld heads, ff %lld, %lld parameters; steps %lld-%lld in %.2f s",
              a.resume.empty() ? a.task.c_str() : "resumed", static_cast<long long>(m.layers),
              static_cast<long long>(m.d_model), static_cast<long long>(m.heads), static_cast<long long>(m.ff),
              static_cast<long long>(parameters), static_cast<long long>(first), static_cast<long long>(o.steps),
              seconds);
  if (o.steps > first)
    std::printf("; loss %.4f -> %.4f, accuracy %.1f%% -> %.1f%%, %s tokens/s", first_stats.loss, last_stats.loss,
                100.0 * first_stats.accuracy, 100.0 * last_stats.accuracy,
                rate(seconds > 0 ? double(progress.tokens()) / seconds : 0.0).c_str());
  if (o.dtype != ComputeDtype::F32) std::printf("; dtype %s", to_string(o.dtype).c_str());
  if (o.dtype == ComputeDtype::F16)
    std::printf(", %lld steps skipped (loss scaling)", static_cast<long long>(progress.skipped()));
  if (!a.checkpoint_out.empty()) std::printf("; checkpoint %s", a.checkpoint_out.c_str());
  if (!a.parallel.empty()) std::printf("; %d ranks", ranks.size);
  std::printf("\n");
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand(
      "train", "Train a small Transformer encoder (embedding, positions, attention blocks) on a built-in task");
  c->add_option("--task", a->task, "copy (targets = inputs), reverse (targets = inputs reversed), or lesson, lookup2 "
                                   "(multihead experiment's tasks: their own vocabulary and length; --symbols, --length refused)")
      ->transform(one_of(task_names()));
  c->add_option("--symbols", a->symbols, "Vocabulary: token ids 0 … N-1")
      ->check(integer_in(2, 65536, "2 to 65536 symbols"));
  c->add_option("--length", a->length, "Sequence length L")->check(integer_in(1, 65536, "a length of 1 to 65536"));
  c->add_option("--layers", a->model.layers, "Attention blocks")->check(integer_in(1, 1024, "1 to 1024 layers"));
  c->add_option("--d-model", a->model.d_model, "Model width E")->check(integer_in(1, 65536, "a width of 1 to 65536"));
  c->add_option("--heads", a->model.heads, "Attention heads (must divide --d-model)")->check(positive_integer());
  c->add_option("--ff", a->model.ff, "Feed-forward width (Linear-ReLU-Linear per block); 0 = none")
      ->check(integer_in(0, 1 << 20, "0 to 2^20"));
  c->add_option("--dropout", a->model.dropout, "Dropout on the attention weights while training")
      ->check(unit_interval_open("a probability"));
  c->add_flag("--causal", a->model.causal, "Causal self-attention (each position sees itself and the past)");
  c->add_option("--positions", a->positions,
                "Positional encoding: none, sinusoidal (added to the embeddings), rope (rotary, on each head's query "
                "and key), alibi (a per-head distance penalty on the scores)")
      ->transform(one_of({"none", "sinusoidal", "rope", "alibi"}));
  c->add_option("--steps", a->train.steps, "Training steps in all (with --resume: up to this step)")
      ->check(non_negative_integer());
  c->add_option("--batch", a->train.batch, "Sequences per step")->check(positive_integer());
  c->add_option("--lr", a->train.lr, "Peak learning rate (AdamW)")->check(positive_number());
  c->add_option("--warmup", a->train.warmup, "Linear warm-up steps (lr/warmup, 2·lr/warmup, … lr)")
      ->check(non_negative_integer());
  c->add_option("--schedule", a->schedule, "After warm-up: constant, or cosine down to 0.1·lr at the last step")
      ->transform(one_of({"constant", "cosine"}));
  c->add_option("--weight-decay", a->train.weight_decay,
                "AdamW's decoupled weight decay, on weight matrices only (not biases, norms, embedding)")
      ->check(non_negative_number());
  c->add_option("--beta1", a->train.beta1, "AdamW's first-moment decay")->check(unit_interval_open("beta1"));
  c->add_option("--beta2", a->train.beta2, "AdamW's second-moment decay")->check(unit_interval_open("beta2"));
  c->add_option("--adam-eps", a->train.eps, "AdamW's epsilon")->check(positive_number());
  c->add_option("--clip", a->train.clip, "Clip the global gradient norm to this; 0 = no clipping")
      ->check(non_negative_number());
  c->add_option("--seed", a->train.seed, "Seed of initialisation, data and dropout (same seed, same losses)")
      ->check(unsigned_integer());
  c->add_option("--threads", a->train.threads, "Threads (0 = default); the losses do not depend on it")
      ->check(non_negative_integer());
  c->add_option("--checkpoint-out", a->checkpoint_out,
                "Write a checkpoint here (safetensors: parameters under PyTorch names, AdamW state, settings) "
                "at the end")
      ->check(path());
  c->add_option("--checkpoint-every", a->checkpoint_every, "Also write --checkpoint-out every N steps; 0 = at the end only")
      ->check(non_negative_integer());
  c->add_option("--resume", a->resume,
                "Continue the run saved in this checkpoint: its settings, and a flag given must agree with them, except "
                "--steps, which may be larger (with --schedule cosine that reshapes the remaining schedule)")
      ->check(path());
  c->add_option("--dump-gradients", a->dump_gradients,
                "The first batch (tokens, targets, mask), its loss and every parameter's gradient (grad.NAME) before "
                "any step, as safetensors, written when the run ends well; with --steps 0 nothing is trained (dropout applies as in "
                "training: compare with PyTorch at --dropout 0)")
      ->check(path());
  c->add_option("--log-interval", a->log_interval, "Without a terminal: one log line every K steps (and the last)")
      ->check(positive_integer());
  c->add_option("--parallel", a->parallel,
                "data: data-parallel training, under mpirun -np P (P dividing --batch) or alone as one rank. "
                "Each example's gradient comes from its own pass and the gradients are added in example order, "
                "so every P prints the losses and writes the checkpoint of the one-process run, `multihead train "
                "--parallel data ...` without mpirun (not those of train without --parallel, which sums the "
                "batch at once). Rank 0 prints and writes the files. Needs a build with MPI")
      ->transform(one_of({"data"}));
  c->add_option("--dtype", a->dtype,
                "Compute type of the forward and backward: f32 (default), bf16 or f16 (mixed precision, as PyTorch's "
                "autocast: the linear maps and the attention in 16 bits, layer norms, softmax, the loss and AdamW "
                "in float32; the weights and AdamW's moments stay float32; f16 scales the loss dynamically, "
                "docs/precision.md; with --positions rope the grouped-query attention runs in 16 bits too). Not with "
                "--parallel data")
      ->transform(one_of({"f32", "bf16", "f16"}));
  c->add_option("--progress", a->progress, "auto (a bar on a terminal, else lines), bar, lines or none")
      ->transform(one_of({"auto", "bar", "lines", "none"}));
  return [a, c] { run_train(*a, *c); };
}

}  // namespace multihead::cli
