// multihead/head_ablation.hpp: which heads a trained model needs (Michel,
// Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", §3–4).
//
// A gate ξ_h multiplies head h's output before the output projection of
// its layer:  attn(x) = Σ_h ξ_h · o_h W_o,hᵀ + b_o,  ξ_h = 1 in the model as
// trained, where o_h (N, D) is head h's output and W_o,h the D columns of
// out_proj.weight that read it. Then
//   - importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1, over the test set's
//     sequences x (L(x): the cross-entropy of x's counted positions), with
//     ∂L/∂ξ_h = <dL/do_h, o_h> = <dL/dW_o,h, W_o,h> exactly: the
//     backward's gradient of out_proj.weight, read per head (the
//     Frobenius product of its D columns with the weight's);
//   - masked alone: the test accuracy with ξ_h = 0 for one head;
//   - pruning: heads masked one after another, least important first, the
//     accuracy after each. As in the paper (§4.1) the importances are
//     divided by their layer's ℓ2 norm before the heads of all layers are
//     ordered, and computed once, on the unpruned model.
// With every head masked, each layer's attention block outputs only
// out_proj.bias: that is the "no attention" accuracy.
//
// Legend: H heads per layer, layers blocks; a head's index k = layer·H + h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "multihead/train.hpp"
#include "multihead/trained_model.hpp"

namespace multihead {

struct HeadAblation {
  int64_t layers = 0, heads = 0;      // heads per layer
  double accuracy = 0;                // nothing masked (= model.evaluate(test).accuracy)
  double no_attention_accuracy = 0;   // every head masked
  std::vector<double> importance;     // (layers·H) I_h
  std::vector<double> masked_alone;   // (layers·H) accuracy with head k masked alone
  std::vector<int64_t> prune_order;   // (layers·H) head indices, least important (layer-normalised) first
  std::vector<double> pruned_accuracy;  // (layers·H + 1): after masking the first k of prune_order
  int64_t sequences = 0;              // test sequences the importance averages over
};

// The model with gates ξ (layers·H values, head k = layer·H + h) on its
// heads' outputs: out_proj.weight's columns of head k scaled by ξ_k.
// Throws multihead::Error naming `gates` when its size is not layers·H.
TrainedModel gated_model(const TrainedModel& model, const std::vector<double>& gates);

// ∂L/∂ξ at ξ = 1 (layers·H values) of the model's loss on `batch` (the mean
// cross-entropy over its counted positions), from one backward pass.
std::vector<double> head_gate_gradients(const TrainedModel& model, const Batch& batch);

// Importance, masked-alone and pruning accuracies on `test_set` (a held-out
// task's test_set()). Each sequence of the set is one x of the importance.
HeadAblation ablate_heads(const TrainedModel& model, const Batch& test_set);

}  // namespace multihead
