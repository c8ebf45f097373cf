// src/train/experiment_report.cpp: the experiment's Markdown table and JSON
// file (multihead/experiment.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "multihead/experiment.hpp"
#include "multihead/lesson_tasks.hpp"

namespace multihead {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string percent(double v) { return fmt("%.1f", 100.0 * v); }

std::string p_value(double p) {
  if (p < 1e-4) return fmt("%.1e", p);
  return fmt("%.4f", p);
}

std::string reason(const std::string& task) {
  std::shared_ptr<const Task> t = make_task(task, 2, 1);
  const auto* h = dynamic_cast<const HeldOutTask*>(t.get());
  return h ? h->chance_reason() : "";
}

}  // namespace

std::string experiment_markdown(const ExperimentReport& r) {
  const ExperimentOptions& o = r.options;
  std::string s;
  s += "Held-out test accuracy in percent, mean ± sample std over " + std::to_string(o.seeds) +
       " seeds; d_model " + std::to_string(o.d_model) + ", ff " + std::to_string(o.ff) + ", " +
       std::to_string(o.train.steps) + " steps of " + std::to_string(o.train.batch) + " sequences, lr " +
       fmt("%g", o.train.lr) + " for every run.\n\n";
  for (const auto& [task, chance] : r.chance) {
    const bool lesson = task == "lesson";
    s += "**" + task + "** (chance " + percent(chance) + "%: " + reason(task) + ")\n\n";
    s += "| layers | heads | head width | parameters | test accuracy % | early test accuracy % | final train loss |";
    if (lesson) s += " heads split (seeds) | referent-head mass | adjective-head mass |";
    s += "\n|---:|---:|---:|---:|---:|---:|---:|";
    if (lesson) s += "---:|---:|---:|";
    s += "\n";
    for (const CellSummary& c : r.cells) {
      if (c.task != task) continue;
      s += "| " + std::to_string(c.layers) + " | " + std::to_string(c.heads) + " | " +
           std::to_string(o.d_model / c.heads) + " | " + std::to_string(c.parameters) + " | " +
           percent(c.accuracy_mean) + " ± " + percent(c.accuracy_std) + " | " + percent(c.early_mean) + " ± " +
           percent(c.early_std) + " | " + fmt("%.3f", c.final_loss_mean) + " |";
      if (lesson)
        s += " " + std::to_string(c.split_runs) + "/" + std::to_string(c.n) + " | " +
             fmt("%.2f", c.referent_mass_mean) + " | " + fmt("%.2f", c.adjective_mass_mean) + " |";
      s += "\n";
    }
    s += "\n";
  }
  int64_t early_step = 0;
  for (const RunResult& x : r.runs) early_step = std::max(early_step, x.early_step);
  s += "Early test accuracy: at step " + std::to_string(early_step) + " of " + std::to_string(o.train.steps) +
       " (the first measurement at or after a fifth of the run).\n\n";
  s += "Welch's t-test, best h against h = 1 (two-sided), on the final and on the early test accuracy:\n\n";
  s += "| task | layers | accuracy | h = 1 % | best h | best % | t | df | p |\n"
       "|---|---:|---|---:|---:|---:|---:|---:|---:|\n";
  for (const Comparison& c : r.comparisons) {
    s += "| " + c.task + " | " + std::to_string(c.layers) + " | " + c.metric + " | " + percent(c.one_head_mean) + " | " +
         std::to_string(c.best_heads) + " | " + percent(c.best_mean) + " | ";
    if (c.best_heads == 1) s += "– | – | – |\n";
    else
      s += (std::isinf(c.t) ? std::string(c.t > 0 ? "inf" : "-inf") : fmt("%.2f", c.t)) + " | " +
           fmt("%.1f", c.df) + " | " + p_value(c.p) + " |\n";
  }
  return s;
}

std::string experiment_json(const ExperimentReport& r) {
  using nlohmann::json;
  const ExperimentOptions& o = r.options;
  json j;
  j["format"] = "multihead-experiment-1";
  j["command"] = r.command;
  j["seconds"] = r.seconds;
  j["options"] = {{"tasks", o.tasks},
                  {"heads", o.heads},
                  {"layers", o.layers},
                  {"seeds", o.seeds},
                  {"first_seed", o.first_seed},
                  {"d_model", o.d_model},
                  {"ff", o.ff},
                  {"steps", o.train.steps},
                  {"batch", o.train.batch},
                  {"lr", o.train.lr},
                  {"warmup", o.train.warmup},
                  {"schedule", to_string(o.train.schedule)},
                  {"weight_decay", o.train.weight_decay},
                  {"clip", o.train.clip},
                  {"curve_points", o.curve_points},
                  {"workers", o.workers}};
  json chance = json::object();
  for (const auto& [task, c] : r.chance) chance[task] = {{"accuracy", c}, {"reason", reason(task)}};
  j["chance"] = chance;
  json runs = json::array();
  for (const RunResult& x : r.runs) {
    json run = {{"task", x.spec.task},
                {"heads", x.spec.heads},
                {"layers", x.spec.layers},
                {"seed", x.spec.seed},
                {"parameters", x.parameters},
                {"first_loss", x.first_loss},
                {"final_loss", x.final_loss},
                {"test_loss", x.test_loss},
                {"test_accuracy", x.test_accuracy},
                {"early_step", x.early_step},
                {"early_accuracy", x.early_accuracy},
                {"seconds", x.seconds},
                {"command", run_command(x.spec, o, "run.safetensors")},
                {"curve", {{"step", x.curve_steps},
                           {"train_loss", x.curve_train_loss},
                           {"test_accuracy", x.curve_test_accuracy}}}};
    if (x.spec.task == "lesson") {
      json focus = json::array();
      for (const HeadFocus& f : x.focus)
        focus.push_back({{"layer", f.layer},
                         {"head", f.head},
                         {"referent", f.referent},
                         {"adjective", f.adjective},
                         {"subject", f.subject},
                         {"object", f.object}});
      run["head_focus"] = focus;
      run["roles"] = {{"referent_layer", x.roles.referent_layer}, {"referent_head", x.roles.referent_head},
                      {"referent_mass", x.roles.referent},       {"adjective_layer", x.roles.adjective_layer},
                      {"adjective_head", x.roles.adjective_head}, {"adjective_mass", x.roles.adjective},
                      {"split", x.roles.split()}};
    }
    runs.push_back(run);
  }
  j["runs"] = runs;
  json cells = json::array();
  for (const CellSummary& c : r.cells) {
    json cell = {{"task", c.task},
                 {"heads", c.heads},
                 {"layers", c.layers},
                 {"parameters", c.parameters},
                 {"n", c.n},
                 {"accuracy_mean", c.accuracy_mean},
                 {"accuracy_std", c.accuracy_std},
                 {"early_mean", c.early_mean},
                 {"early_std", c.early_std},
                 {"final_loss_mean", c.final_loss_mean}};
    if (c.task == "lesson") {
      cell["split_runs"] = c.split_runs;
      cell["referent_mass_mean"] = c.referent_mass_mean;
      cell["adjective_mass_mean"] = c.adjective_mass_mean;
    }
    cells.push_back(cell);
  }
  j["cells"] = cells;
  json cmp = json::array();
  for (const Comparison& c : r.comparisons) {
    json x = {{"metric", c.metric},
              {"task", c.task},          {"layers", c.layers},      {"best_heads", c.best_heads},
              {"one_head_mean", c.one_head_mean}, {"best_mean", c.best_mean}, {"df", c.df},
              {"p", c.p}};
    // JSON has no infinity: a t of ±inf (both samples constant) is written as a string.
    x["t"] = std::isinf(c.t) ? json(c.t > 0 ? "inf" : "-inf") : json(c.t);
    cmp.push_back(x);
  }
  j["comparisons"] = cmp;
  return j.dump(1) + "\n";
}

}  // namespace multihead
