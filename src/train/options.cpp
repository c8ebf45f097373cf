// src/train/options.cpp: validation of the model and training settings,
// and the learning-rate schedule (multihead/train.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>

#include "multihead/error.hpp"
#include "multihead/train.hpp"

namespace multihead {
namespace {

[[noreturn]] void bad(const std::string& field, const std::string& expected, const std::string& got) {
  throw Error(Error::Kind::Value, field + ": expected " + expected + ", got " + got);
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

void ModelConfig::validate() const {
  if (vocabulary < 2) bad("vocabulary", "at least 2", std::to_string(vocabulary));
  if (sequence_length < 1) bad("sequence_length", "at least 1", std::to_string(sequence_length));
  if (d_model < 1 || d_model > 65536) bad("d_model", "1 to 65536", std::to_string(d_model));
  if (heads < 1 || d_model % heads != 0)
    bad("heads", "a divisor of d_model " + std::to_string(d_model), std::to_string(heads));
  if (layers < 1 || layers > 1024) bad("layers", "1 to 1024", std::to_string(layers));
  if (ff < 0 || ff > 1 << 20) bad("ff", "0 (none) to 2^20", std::to_string(ff));
  if (!(dropout >= 0.0 && dropout < 1.0)) bad("dropout", "a probability in [0, 1)", num(dropout));
  if (positions == Positions::Rope && (d_model / heads) % 2 != 0)
    bad("heads", "a count that leaves an even head width d_model/heads (RoPE rotates pairs)",
        std::to_string(heads) + " (head width " + std::to_string(d_model) + "/" + std::to_string(heads) + " = " +
            std::to_string(d_model / heads) + ")");
}

void TrainOptions::validate() const {
  if (steps < 0) bad("steps", "an integer >= 0", std::to_string(steps));
  if (batch < 1) bad("batch", "a positive integer", std::to_string(batch));
  if (!(lr > 0.0 && std::isfinite(lr))) bad("lr", "a finite number > 0", num(lr));
  if (warmup < 0) bad("warmup", "an integer >= 0", std::to_string(warmup));
  if (!(weight_decay >= 0.0 && std::isfinite(weight_decay)))
    bad("weight_decay", "a finite number >= 0", num(weight_decay));
  if (!(beta1 >= 0.0 && beta1 < 1.0)) bad("beta1", "a number in [0, 1)", num(beta1));
  if (!(beta2 >= 0.0 && beta2 < 1.0)) bad("beta2", "a number in [0, 1)", num(beta2));
  if (!(eps > 0.0 && std::isfinite(eps))) bad("eps", "a finite number > 0", num(eps));
  if (!(clip >= 0.0 && std::isfinite(clip))) bad("clip", "a finite number >= 0 (0 = off)", num(clip));
  if (threads < 0) bad("threads", "an integer >= 0", std::to_string(threads));
  if (dtype != ComputeDtype::F32 && gradients == GradientSum::PerExample)
    bad("dtype", "f32 with per-example gradients (data parallelism runs in float32 only)", to_string(dtype));
}

std::string to_string(Schedule schedule) { return schedule == Schedule::Constant ? "constant" : "cosine"; }

Schedule parse_schedule(const std::string& name) {
  if (name == "constant") return Schedule::Constant;
  if (name == "cosine") return Schedule::Cosine;
  throw Error(Error::Kind::Value, "schedule: expected one of constant, cosine; got " + quote_input(name));
}

std::string to_string(Positions p) {
  switch (p) {
    case Positions::None: return "none";
    case Positions::Sinusoidal: return "sinusoidal";
    case Positions::Rope: return "rope";
    case Positions::Alibi: return "alibi";
  }
  return "sinusoidal";
}

Positions parse_positions(const std::string& name, const std::string& what) {
  for (Positions p : {Positions::None, Positions::Sinusoidal, Positions::Rope, Positions::Alibi})
    if (name == to_string(p)) return p;
  throw Error(Error::Kind::Value, what + ": expected one of none, sinusoidal, rope, alibi; got " + quote_input(name));
}

double learning_rate(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  if (o.schedule == Schedule::Constant) return o.lr;
  // Cosine from lr at the end of warm-up to 0.1·lr at the last step
  // (the floor keeps the last steps learning, as in Chinchilla's schedule).
  const int64_t span = o.steps - o.warmup;
  const double p = span > 1 ? std::min(1.0, double(step - o.warmup) / double(span - 1)) : 0.0;
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

}  // namespace multihead
