// python/src/options.hpp: the one table of the Python calls' keyword
// arguments. Each keyword is one row, X(Type, name, default, into, doc):
//   Type     the C++ type pybind11 converts the argument to;
//   name     the Python keyword (also the member of the call struct below);
//   default  its default (the member's initializer; the py::arg default and
//            the docstring's "name=..." are read from that member);
//   into     the statement that puts its value `v` into the library's
//            options: `a` is the AttentionOptions, `f` the ForwardOptions<T>
//            (empty: the binding reads the member itself);
//   doc      its line in the docstring.
// The rows generate the call structs (ModuleCall, SdpaCall), the bound
// functions' parameters and py::arg lists (module.cpp), their docstrings'
// signatures and keyword sections, and the conversion into the library's
// options (forward_options, attention_options). A new keyword is one row
// here, plus its line in multihead/__init__.pyi (python/tests/test_stubs.py
// fails until the stub agrees with the binding).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/train.hpp"

// torch.nn.MultiheadAttention.forward's arguments after (query, key, value),
// positional, in PyTorch's order (forward, __call__, forward_with_context).
#define MULTIHEAD_MODULE_POSITIONAL(X)                                                                        \
  X(py::object, key_padding_mask, py::none(), ,                                                               \
    "(N, S) or (S) unbatched. Bool (or uint8): True marks a key to ignore. Float: added to the attention "    \
    "scores (PyTorch 2.x semantics).")                                                                        \
  X(bool, need_weights, true, f.need_weights = v, "If True, also return attn_output_weights. Default: True.") \
  X(py::object, attn_mask, py::none(), ,                                                                      \
    "(L, S) or (N*num_heads, L, S). Bool: True means \"may not attend\". Float: added to the attention "      \
    "scores.")                                                                                                \
  X(bool, average_attn_weights, true, f.average_attn_weights = v,                                             \
    "If True, the returned weights are averaged over the heads, (N, L, S); else per head, (N, num_heads, "    \
    "L, S). Default: True.")                                                                                  \
  X(bool, is_causal, false, a.is_causal = v,                                                                  \
    "If True, query i may not attend to key j > i (combined with attn_mask). Default: False.")

// torch.nn.functional.scaled_dot_product_attention's (2.x) arguments after
// (query, key, value), positional, in PyTorch's order.
#define MULTIHEAD_SDPA_POSITIONAL(X)                                                                       \
  X(py::object, attn_mask, py::none(), ,                                                                   \
    "(L, S), or (..., L, S) with the query's leading dimensions exactly (no broadcasting of size-1 "      \
    "dimensions, which torch 2.x allows). Bool: True means \"may attend\" (as in torch's "                \
    "scaled_dot_product_attention, the opposite of MultiheadAttention's masks). Float: added to the "     \
    "scores.")                                                                                             \
  X(double, dropout_p, 0.0, a.dropout_p = v,                                                               \
    "Dropout probability on the weights (applied whenever > 0, as torch does). Default: 0.0.")             \
  X(bool, is_causal, false, a.is_causal = v, "Query i may attend only to keys j <= i (top-left aligned).") \
  X(std::optional<double>, scale, std::nullopt, a.scale = v,                                               \
    "Multiplies query @ key^T. Default: None (1/sqrt(D)).")

// Keyword-only, not in PyTorch: every attention call (MultiheadAttention's
// forwards, scaled_dot_product_attention and GroupedQueryAttention's, which
// takes all but causal_align: its causal rule is its own, bottom-right over
// the KV cache). In the signatures' order: KERNEL, CAUSAL_ALIGN, SCORE.
#define MULTIHEAD_ATTENTION_KEYWORDS(X) \
  MULTIHEAD_KERNEL_KEYWORDS(X) MULTIHEAD_CAUSAL_ALIGN_KEYWORD(X) MULTIHEAD_SCORE_KEYWORDS(X)
#define MULTIHEAD_KERNEL_KEYWORDS(X)                                                                      \
  X(std::string, masked_rows, "zeros", a.masked_rows = parse_masked_rows(v),                              \
    "What a query gets when every key is masked: 'zeros' (default: zero weights, attention output 0) or " \
    "'nan' (PyTorch 1.13's result).")                                                                     \
  X(std::string, kernel, "auto", a.kernel = parse_attention_kernel(v),                                    \
    "'auto', 'reference', 'materialized' or 'flash'.")                                                    \
  X(int, num_threads, 0, a.num_threads = v, "Threads of the attention loops; 0 = OpenMP's default.")      \
  X(bool, check_finite, false, a.check_finite = v, "Reject NaN or Inf in the inputs (ValueError).")       \
  X(uint64_t, dropout_seed, 0, a.dropout_seed = v,                                                        \
    "Seed of the dropout mask (the module's dropout in training mode; dropout_p in "                      \
    "scaled_dot_product_attention).")
#define MULTIHEAD_CAUSAL_ALIGN_KEYWORD(X)                                                                 \
  X(std::string, causal_align, "top-left", a.causal_alignment = parse_causal_align(v),                    \
    "Where query i sits when L != S: 'top-left' (position i, PyTorch's is_causal) or 'bottom-right' "     \
    "(i + S - L). Used by is_causal, window and alibi (docs/semantics.md, \"Positions\").")
#define MULTIHEAD_SCORE_KEYWORDS(X)                                                                       \
  X(std::optional<int64_t>, window, std::nullopt, a.window = v,                                           \
    "Sliding window of w keys: with is_causal a query sees its own position and the w - 1 before it; "    \
    "without, keys less than w away.")                                                                    \
  X(std::optional<double>, softcap, std::nullopt, a.softcap = v,                                          \
    "Logit soft-cap c in [2^-126, 2^126]: scores become c*tanh(score/c) (Gemma 2).")

// Keyword-only, not in PyTorch: the module's forwards only.
#define MULTIHEAD_MODULE_KEYWORDS(X)                                                                         \
  X(bool, alibi, false, f.alibi = v, "ALiBi biases -m_h*|p_i - j| with the paper's slopes per head "         \
    "(alibi_slopes(num_heads)).")                                                                            \
  X(std::optional<std::vector<int64_t>>, weights_heads, std::nullopt,                                        \
    f.weights_heads = selection("weights_heads", v),                                                    \
    "Only these heads' weights (a sequence of head indices, each at most once, in the order given; None = "  \
    "all). Per head the weights are (N, H', L, S); averaged, the mean over the H' selected heads. Needs "    \
    "need_weights=True.")                                                                                    \
  X(std::optional<std::vector<int64_t>>, weights_rows, std::nullopt,                                         \
    f.weights_rows = selection("weights_rows", v),                                                     \
    "Only these query rows' weights (indices, e.g. range(5, 9); None = all): (N, ..., L', S). On the flash " \
    "kernel (float32, kernel='auto' or 'flash') only the selection is computed and held, recomputed from "   \
    "each row's log-sum-exp (docs/explain.md).")

// Keyword-only, not in PyTorch: scaled_dot_product_attention only.
#define MULTIHEAD_SDPA_KEYWORDS(X)                                                                       \
  X(bool, need_weights, false, , "Also return the weights, (..., L, S). Default: False.")                \
  X(std::vector<double>, alibi_slopes, {}, a.alibi_slopes = v,                                           \
    "ALiBi, one slope per slice (the product of the leading dimensions); empty (default) = none.")       \
  X(py::object, dtype, py::none(), ,                                                                     \
    "What the call computes in: None (default: float64 for a float64 query, else float32), 'float32', "  \
    "'float64', or 'bfloat16' / 'float16' (also 'bf16', 'f16'): query, key and value stored in that "    \
    "type, each a uint16 array of its bits, a float16 array (float16 only) or a float32 array (rounded " \
    "to nearest even); the output is the query's kind (uint16 bits, float16, or float32 widened). "      \
    "16-bit: no weights; the backward's gradients are the kind of array d_output is (docs/precision.md).")

// Keyword-only: GroupedQueryAttention's forwards only (after the KERNEL and
// SCORE rows). `heads` is the module's query-head count.
#define MULTIHEAD_GQA_KEYWORDS(X)                                                                    \
  X(bool, alibi, false, if (v) a.alibi_slopes = alibi_slopes(heads),                                 \
    "ALiBi biases -m_h*|p_i - j| with the paper's slopes per query head (alibi_slopes(num_heads)).") \
  X(std::optional<double>, scale, std::nullopt, a.scale = v, "Multiplies q @ k^T. Default: None (1/sqrt(head_dim)).")

// multihead.Trainer's keywords, one row per field of the library's
// ModelConfig (`m`) and TrainOptions (`t`), defaults read from them (the
// same settings as `multihead train`'s flags).
#define MULTIHEAD_TRAINER_KEYWORDS(X)                                                                      \
  X(int64_t, d_model, ModelConfig{}.d_model, m.d_model = v, "Model width E.")                              \
  X(int64_t, heads, ModelConfig{}.heads, m.heads = v, "Attention heads (dividing d_model).")               \
  X(int64_t, layers, ModelConfig{}.layers, m.layers = v, "Attention blocks.")                              \
  X(int64_t, ff, ModelConfig{}.ff, m.ff = v, "Feed-forward width (Linear-ReLU-Linear); 0 = none.")         \
  X(double, dropout, ModelConfig{}.dropout, m.dropout = v, "Dropout on the attention weights, training.")  \
  X(bool, causal, ModelConfig{}.causal, m.causal = v, "Causal self-attention.")                            \
  X(std::string, positions, to_string(ModelConfig{}.positions), m.positions = parse_positions(v, "positions"), \
    "Word order: 'sinusoidal' (added to the embedding), 'rope', 'alibi' or 'none'.")                       \
  X(int64_t, steps, TrainOptions{}.steps, t.steps = v, "Training steps in all.")                           \
  X(int64_t, batch, TrainOptions{}.batch, t.batch = v, "Sequences per step.")                              \
  X(double, lr, TrainOptions{}.lr, t.lr = v, "Peak learning rate (AdamW).")                                \
  X(int64_t, warmup, TrainOptions{}.warmup, t.warmup = v, "Linear warm-up steps.")                         \
  X(std::string, schedule, to_string(TrainOptions{}.schedule), t.schedule = parse_schedule(v),             \
    "After warm-up: 'constant', or 'cosine' down to 0.1*lr at the last step.")                             \
  X(double, weight_decay, TrainOptions{}.weight_decay, t.weight_decay = v,                                 \
    "AdamW's decoupled weight decay (weight matrices only).")                                              \
  X(double, beta1, TrainOptions{}.beta1, t.beta1 = v, "AdamW's first-moment decay.")                       \
  X(double, beta2, TrainOptions{}.beta2, t.beta2 = v, "AdamW's second-moment decay.")                      \
  X(double, adam_eps, TrainOptions{}.eps, t.eps = v, "AdamW's epsilon.")                                   \
  X(double, clip, TrainOptions{}.clip, t.clip = v, "Global gradient-norm bound; 0 = no clipping.")         \
  X(uint64_t, seed, TrainOptions{}.seed, t.seed = v, "Seed of initialisation, data and dropout.")          \
  X(std::string, dtype, to_string(TrainOptions{}.dtype), t.dtype = parse_compute_dtype(v, "dtype"),        \
    "Compute type of the passes: 'f32', or 'bf16' / 'f16' (float32 master weights and moments; f16 with " \
    "dynamic loss scaling); also 'float32', 'bfloat16', 'float16'.")                                      \
  X(int, threads, TrainOptions{}.threads, t.threads = v, "Threads of the loops (0 = default); the losses do not depend on it.")

// What the rows expand to. MULTIHEAD_OPTION_MEMBER declares a call struct's
// member; MULTIHEAD_OPTION_INTO runs a row's `into` on a call struct `o`.
#define MULTIHEAD_OPTION_MEMBER(Type, name, def, into, doc) Type name = def;
#define MULTIHEAD_OPTION_INTO(Type, name, def, into, doc) \
  {                                                       \
    [[maybe_unused]] const auto& v = o.name;              \
    into;                                                 \
  }

namespace multihead::python {

namespace py = pybind11;

// weights_heads / weights_rows: None = all (the library's empty list); an
// empty sequence selects nothing, which no call can return: refused.
inline std::vector<int64_t> selection(const char* name, const std::optional<std::vector<int64_t>>& v) {
  if (v && v->empty())
    throw Error(Error::Kind::Value, std::string(name) + ": expected at least one index, or None for all, got []");
  return v.value_or(std::vector<int64_t>{});
}

inline CausalAlignment parse_causal_align(const std::string& s) {
  if (s == "top-left") return CausalAlignment::TopLeft;
  if (s == "bottom-right") return CausalAlignment::BottomRight;
  throw Error(Error::Kind::Value, "causal_align: expected 'top-left' or 'bottom-right', got " + quote_input(s));
}

inline MaskedRowPolicy parse_masked_rows(const std::string& s) {
  if (s == "zeros") return MaskedRowPolicy::Zeros;
  if (s == "nan") return MaskedRowPolicy::NaN;
  throw Error(Error::Kind::Value, "masked_rows: expected 'zeros' or 'nan', got " + quote_input(s));
}

// A MultiheadAttention forward's arguments after (query, key, value),
// defaults included (a default-constructed ModuleCall is the signature's
// defaults; it holds Python objects, so it is made with the GIL held).
struct ModuleCall {
  MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
};

// scaled_dot_product_attention's arguments after (query, key, value).
struct SdpaCall {
  MULTIHEAD_SDPA_POSITIONAL(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_SDPA_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
};

inline AttentionOptions attention_options(const SdpaCall& o) {
  AttentionOptions a;
  MULTIHEAD_SDPA_POSITIONAL(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_SDPA_KEYWORDS(MULTIHEAD_OPTION_INTO)
  return a;
}

// A GroupedQueryAttention forward's keyword arguments (after x).
struct GqaCall {
  MULTIHEAD_KERNEL_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_SCORE_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
  MULTIHEAD_GQA_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
};

// The module's dropout rate applies in training mode, as MultiheadAttention's.
inline AttentionOptions gqa_options(const GqaCall& o, int64_t heads, bool training, double dropout) {
  AttentionOptions a;
  a.dropout_p = training ? dropout : 0.0;
  MULTIHEAD_KERNEL_KEYWORDS(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_SCORE_KEYWORDS(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_GQA_KEYWORDS(MULTIHEAD_OPTION_INTO)
  return a;
}

// multihead.Trainer's settings.
struct TrainerCall {
  MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_OPTION_MEMBER)
};

inline void trainer_settings(const TrainerCall& o, ModelConfig& m, TrainOptions& t) {
  MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_OPTION_INTO)
}

// The masks are the caller's (converted from o.key_padding_mask and
// o.attn_mask, held while the call runs); training is the module's.
template <class T>
ForwardOptions<T> forward_options(const ModuleCall& o, bool training, const Mask<T>* key_padding_mask,
                                  const Mask<T>* attn_mask) {
  ForwardOptions<T> f;
  f.key_padding_mask = key_padding_mask;
  f.attn_mask = attn_mask;
  f.training = training;
  // The attention step's options. Its dropout rate is the module's, so
  // attention.dropout_p stays 0 (no module row sets it).
  AttentionOptions& a = f.attention;
  MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_OPTION_INTO)
  MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_OPTION_INTO)
  return f;
}

}  // namespace multihead::python
