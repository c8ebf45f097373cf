// src/train/experiment_report.cpp: the experiment's Markdown tables and JSON
// file (multihead/experiment.hpp; the JSON's schema: docs/experiment.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "multihead/experiment.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/statistics.hpp"

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

std::string signed_number(double t) {
  if (std::isinf(t)) return t > 0 ? "inf" : "-inf";
  return fmt("%.2f", t);
}

std::string reason(const std::string& task) {
  if (task == "reverse") return HeldOutReverseTask().chance_reason();
  std::shared_ptr<const Task> t = make_task(task, 2, 1);
  const auto* h = dynamic_cast<const HeldOutTask*>(t.get());
  return h ? h->chance_reason() : "";
}

// Accuracy-like families are shown in points, the rest as they are.
bool in_points(const std::string& family) { return family.find("steps") == std::string::npos; }

std::string verdict(const Comparison& c) {
  if (c.p_holm < 0.05) return c.mean_difference > 0 ? "a > b" : "a < b";
  if (c.has_tost && c.tost_p_holm < 0.05) return "equivalent (±" + fmt("%.0f", 100 * c.tost_margin) + " points)";
  return "inconclusive";
}

// JSON has no infinity: ±inf is written as the string "inf" / "-inf".
nlohmann::json finite_or_string(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json measures_json(const HeadMeasures& m) {
  using nlohmann::json;
  json focus = json::array();
  for (const HeadFocus& f : m.focus)
    focus.push_back({{"layer", f.layer},
                     {"head", f.head},
                     {"referent", f.referent},
                     {"adjective", f.adjective},
                     {"subject", f.subject},
                     {"object", f.object},
                     {"on_subject", f.on_subject},
                     {"on_object", f.on_object},
                     {"adjective_selectivity", f.adjective_selectivity},
                     {"referent_score", f.referent_score()},
                     {"subject_preference", f.subject_preference()},
                     {"role", to_string(head_role(f))},
                     {"adjective_head", is_adjective_head(f)}});
  const HeadRoles& r = m.roles;
  return {{"focus", focus},
          {"roles",
           {{"referent_head", head_name(r.referent_layer, r.referent_head)},
            {"subject_head", head_name(r.subject_layer, r.subject_head)},
            {"object_head", head_name(r.object_layer, r.object_head)},
            {"adjective_head", head_name(r.adjective_layer, r.adjective_head)},
            {"referent", r.referent},
            {"adjective", r.adjective},
            {"subject", r.subject},
            {"referent_heads", r.referent_heads},
            {"subject_heads", r.subject_heads},
            {"object_heads", r.object_heads},
            {"adjective_heads", r.adjective_heads}}}};
}

}  // namespace

std::string experiment_markdown(const ExperimentReport& r) {
  const ExperimentOptions& o = r.options;
  const bool several_positions = o.positions.size() > 1;
  std::string s;
  s += "Held-out test accuracy in percent, mean ± sample std over " + std::to_string(o.seeds) +
       " seeds (untrained: the same models at step 0); d_model " + std::to_string(o.d_model) + ", ff " +
       std::to_string(o.ff) + ", " + std::to_string(o.train.steps) + " steps of " + std::to_string(o.train.batch) +
       " sequences, lr " + fmt("%g", o.train.lr) + " for every run. Area: the mean test accuracy over the run (the "
       "area under the test-accuracy curve over the steps, from step 0). Steps to 90%: the first of the " +
       std::to_string(o.curve_points) + " curve points at 90% of the final accuracy.\n\n";
  for (const auto& [task, chance] : r.chance) {
    bool heads = false;
    for (const CellSummary& c : r.cells)
      if (c.task == task && c.has_heads) heads = true;
    s += "**" + task + "** (chance " + percent(chance) + "%: " + reason(task) + ")\n\n";
    s += "| layers |";
    if (several_positions) s += " positions |";
    s += " heads | parameters | test accuracy % | untrained % | area % | steps to 90% | final train loss |";
    if (heads)
      s += " referent selectivity (untrained, permuted) | adjective selectivity (untrained, permuted) | seeds with a "
           "referent / subject / object head |";
    s += "\n|---:|";
    if (several_positions) s += "---|";
    s += "---:|---:|---:|---:|---:|---:|---:|";
    if (heads) s += "---:|---:|---:|";
    s += "\n";
    for (const CellSummary& c : r.cells) {
      if (c.task != task) continue;
      s += "| " + std::to_string(c.layers) + " | ";
      if (several_positions) s += to_string(c.positions) + " | ";
      s += std::to_string(c.heads) + " | " + std::to_string(c.parameters) + " | " + percent(c.accuracy_mean) + " ± " +
           percent(c.accuracy_std) + " | " + percent(c.untrained_accuracy_mean) + " | " + percent(c.area_mean) + " | " +
           fmt("%.0f", c.steps_to_90_mean) + " | " + fmt("%.3f", c.final_loss_mean) + " |";
      if (heads) {
        if (c.has_heads)
          s += " " + fmt("%.2f", c.referent_mean) + " (" + fmt("%.2f", c.referent_untrained_mean) + ", " +
               fmt("%.2f", c.referent_permuted_mean) + ") | " + fmt("%.2f", c.adjective_mean) + " (" +
               fmt("%.2f", c.adjective_untrained_mean) + ", " + fmt("%.2f", c.adjective_permuted_mean) + ") | " +
               std::to_string(c.runs_with_referent_head) + " / " + std::to_string(c.runs_with_subject_head) + " / " +
               std::to_string(c.runs_with_object_head) + " of " + std::to_string(c.n) + " |";
        else
          s += " – | – | – |";
      }
      s += "\n";
    }
    s += "\n";
  }
  s += "Selectivity: the best head's score, mean over seeds (docs/experiment.md, \"Head measures\"); a head is a "
       "referent head only if selective for the referent where it is the subject and where it is the object (" +
       fmt("%.2f", kRoleThreshold) + " of attention).\n\n";
  s += "Planned comparisons, paired over the " + std::to_string(o.seeds) +
       " seeds (same seed, same batches): a − b, its 95% bootstrap CI (" + std::to_string(kBootstrapResamples) +
       " resamples, seed " + std::to_string(kBootstrapSeed) + "), Cohen's d_z, the paired t-test, Holm's correction "
       "within each family, and TOST for equivalence within ±" + fmt("%.0f", 100 * kEquivalenceMargin) +
       " accuracy points (Holm-corrected too). Accuracy differences in points.\n\n";
  s += "| family | task | layers | a | b | a | b | a − b | 95% CI | d_z | t | p | Holm p | TOST Holm p | verdict |\n"
       "|---|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|\n";
  for (const Comparison& c : r.comparisons) {
    const double k = in_points(c.family) ? 100 : 1;
    const char* f = in_points(c.family) ? "%.1f" : "%.0f";
    const std::string cell = c.heads > 0 ? " (h=" + std::to_string(c.heads) + (c.positions.empty() || c.positions == "sinusoidal" ? "" : ", " + c.positions) + ")" : "";
    s += "| " + c.family + " | " + c.task + cell + " | " + std::to_string(c.layers) + " | " + c.a + " | " + c.b + " | " +
         fmt(f, k * c.a_mean) + " | " + fmt(f, k * c.b_mean) + " | " + fmt(f, k * c.mean_difference) + " | [" +
         fmt(f, k * c.ci_lower) + ", " + fmt(f, k * c.ci_upper) + "] | " + signed_number(c.dz) + " | " +
         signed_number(c.t) + " | " + p_value(c.p) + " | " + p_value(c.p_holm) + " | " +
         (c.has_tost ? p_value(c.tost_p_holm) : std::string("–")) + " | " + verdict(c) + " |\n";
  }
  s += "\nPower: with " + std::to_string(o.seeds) + " paired seeds a two-sided paired t-test at α = 0.05 has 80% "
       "power for d_z ≈ " + fmt("%.2f", train::paired_detectable_effect(o.seeds, 0.05)) +
       " before the Holm correction (docs/experiment.md).\n";
  return s;
}

std::string experiment_json(const ExperimentReport& r) {
  using nlohmann::json;
  const ExperimentOptions& o = r.options;
  json j;
  j["format"] = "multihead-experiment-2";
  j["command"] = r.command;
  j["seconds"] = r.seconds;
  std::vector<std::string> positions;
  for (Positions p : o.positions) positions.push_back(to_string(p));
  j["options"] = {{"tasks", o.tasks},
                  {"heads", o.heads},
                  {"layers", o.layers},
                  {"positions", positions},
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
  j["statistics"] = {{"alpha", 0.05},
                     {"bootstrap_seed", kBootstrapSeed},
                     {"bootstrap_resamples", kBootstrapResamples},
                     {"bootstrap_level", 0.95},
                     {"equivalence_margin", kEquivalenceMargin},
                     {"role_threshold", kRoleThreshold},
                     {"permutation_seed", kPermutationSeed},
                     {"steps_to_fraction", 0.9}};
  json chance = json::object();
  for (const auto& [task, c] : r.chance) chance[task] = {{"accuracy", c}, {"reason", reason(task)}};
  j["chance"] = chance;
  json runs = json::array();
  for (const RunResult& x : r.runs) {
    json run = {{"task", x.spec.task},
                {"heads", x.spec.heads},
                {"layers", x.spec.layers},
                {"positions", to_string(x.spec.positions)},
                {"seed", x.spec.seed},
                {"parameters", x.parameters},
                {"first_loss", x.first_loss},
                {"final_loss", x.final_loss},
                {"test_loss", x.test_loss},
                {"test_accuracy", x.test_accuracy},
                {"untrained_accuracy", x.untrained_accuracy},
                {"accuracy_area", x.accuracy_area},
                {"steps_to_90", x.steps_to_90},
                {"seconds", x.seconds},
                {"command", run_command(x.spec, o, "run.safetensors")},
                {"curve", {{"step", x.curve_steps},
                           {"train_loss", x.curve_train_loss},
                           {"test_accuracy", x.curve_test_accuracy}}}};
    if (x.has_heads)
      run["heads_measures"] = {{"trained", measures_json(x.trained)},
                               {"untrained", measures_json(x.untrained)},
                               {"permuted", measures_json(x.permuted)}};
    runs.push_back(run);
  }
  j["runs"] = runs;
  json cells = json::array();
  for (const CellSummary& c : r.cells) {
    json cell = {{"task", c.task},
                 {"heads", c.heads},
                 {"layers", c.layers},
                 {"positions", to_string(c.positions)},
                 {"parameters", c.parameters},
                 {"n", c.n},
                 {"accuracy_mean", c.accuracy_mean},
                 {"accuracy_std", c.accuracy_std},
                 {"untrained_accuracy_mean", c.untrained_accuracy_mean},
                 {"area_mean", c.area_mean},
                 {"steps_to_90_mean", c.steps_to_90_mean},
                 {"final_loss_mean", c.final_loss_mean}};
    if (c.has_heads) {
      cell["referent_mean"] = c.referent_mean;
      cell["referent_untrained_mean"] = c.referent_untrained_mean;
      cell["referent_permuted_mean"] = c.referent_permuted_mean;
      cell["adjective_mean"] = c.adjective_mean;
      cell["adjective_untrained_mean"] = c.adjective_untrained_mean;
      cell["adjective_permuted_mean"] = c.adjective_permuted_mean;
      cell["runs_with_referent_head"] = c.runs_with_referent_head;
      cell["runs_with_subject_head"] = c.runs_with_subject_head;
      cell["runs_with_object_head"] = c.runs_with_object_head;
    }
    cells.push_back(cell);
  }
  j["cells"] = cells;
  json cmp = json::array();
  for (const Comparison& c : r.comparisons) {
    json x = {{"family", c.family},
              {"task", c.task},
              {"layers", c.layers},
              {"heads", c.heads},
              {"positions", c.positions},
              {"a", c.a},
              {"b", c.b},
              {"a_values", c.a_values},
              {"b_values", c.b_values},
              {"a_mean", c.a_mean},
              {"b_mean", c.b_mean},
              {"mean_difference", c.mean_difference},
              {"sd_difference", c.sd_difference},
              {"t", finite_or_string(c.t)},
              {"df", c.df},
              {"p", c.p},
              {"dz", finite_or_string(c.dz)},
              {"p_holm", c.p_holm},
              {"ci_lower", c.ci_lower},
              {"ci_upper", c.ci_upper},
              {"verdict", verdict(c)}};
    if (c.has_tost) {
      x["tost_margin"] = c.tost_margin;
      x["tost_p"] = c.tost_p;
      x["tost_p_holm"] = c.tost_p_holm;
    }
    cmp.push_back(x);
  }
  j["comparisons"] = cmp;
  return j.dump(1) + "\n";
}

}  // namespace multihead
