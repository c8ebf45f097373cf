// multihead/multihead_attention.hpp: multi-head attention with the
// configuration, parameters and forward semantics of torch.nn.MultiheadAttention.
//
//   MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O
//   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
//
// Two forms of the forward pass compute the same function:
//  - forward_textbook(): the lesson's four steps, literally. For each head i
//    it slices W_i^Q, W_i^K, W_i^V out of the packed weights and runs three
//    small projections, then scaled dot-product attention, then concatenates
//    the h outputs and applies W^O, all as plain loops (the attention step is
//    always the reference kernel: no BLAS, no SIMD). Easy to read; the
//    oracle the fused form is tested against.
//  - forward(): what frameworks do. One projection product for all heads
//    (in_projection), a reshape into heads (split_heads), attention for every
//    head at once, merge_heads, out_projection.
//
// Training (src/attention/multihead_attention_backward.cpp):
//   ForwardContext<float> ctx;                      // reused every step
//   auto r = mha.forward(q, k, v, options, ctx);    // keeps what backward needs
//   auto g = mha.backward(ctx, d_output);           // g.query, g.parameters["in_proj_weight"], …
//   mha.update_parameters([&](const std::string& name, Tensor<float>& p) { /* p -= lr·g.parameters[name] */ });
//
// Legend: B batch, L query length, S key length, E embed_dim, H num_heads,
// D = E / H head width, Ek = kdim, Ev = vdim.
// Shapes (batch_first = false, PyTorch's default):
//   query (L, B, E), key (S, B, Ek), value (S, B, Ev)   -> output (L, B, E)
// batch_first = true: (B, L, E), (B, S, Ek), (B, S, Ev) -> (B, L, E)
// unbatched:          (L, E),    (S, Ek),    (S, Ev)    -> (L, E)
//   key_padding_mask (B, S) or (S) unbatched
//   attn_mask (L, S) or (B·H, L, S)   [(H, L, S) unbatched]
//   attention weights (B, L, S') averaged, (B, H, L, S') per head, where
//   S' = S + add_bias_kv + add_zero_attn; unbatched drops the B. With a
//   selection (ForwardOptions::weights_heads, weights_rows) of H' heads and
//   L' query rows: (B, L', S') averaged, (B, H', L', S') per head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/parameter_table.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

namespace detail {
template <class T>
class WorkspacePool;
template <class T>
struct ProjectionWeights;
template <class T>
struct SavedForward;
}

// Constructor arguments of torch.nn.MultiheadAttention, same names and defaults.
struct MultiheadAttentionConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  double dropout = 0.0;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  int64_t kdim = 0;  // 0 means embed_dim
  int64_t vdim = 0;  // 0 means embed_dim
  bool batch_first = false;

  int64_t key_dim() const { return kdim == 0 ? embed_dim : kdim; }
  int64_t value_dim() const { return vdim == 0 ? embed_dim : vdim; }
  int64_t head_dim() const { return num_heads > 0 ? embed_dim / num_heads : 0; }
  // PyTorch's _qkv_same_embed_dim: packed in_proj_weight when true, separate
  // q/k/v_proj_weight when kdim or vdim differs from embed_dim.
  bool same_embed_dim() const { return key_dim() == embed_dim && value_dim() == embed_dim; }
  // Throws multihead::Error naming the bad field and value.
  void validate() const;
};

// The learnable tensors, under PyTorch's state_dict names.
template <class T>
struct MultiheadAttentionParameters {
  Tensor<T> in_proj_weight;  // (3E, E)          when same_embed_dim()
  Tensor<T> q_proj_weight;   // (E, E)           otherwise
  Tensor<T> k_proj_weight;   // (E, Ek)
  Tensor<T> v_proj_weight;   // (E, Ev)
  Tensor<T> in_proj_bias;    // (3E)             when bias
  Tensor<T> out_proj_weight; // (E, E)           "out_proj.weight"
  Tensor<T> out_proj_bias;   // (E)              "out_proj.bias", when bias
  Tensor<T> bias_k;          // (1, 1, E)        when add_bias_kv
  Tensor<T> bias_v;          // (1, 1, E)        when add_bias_kv
};

namespace detail {
// The parameter table, written once: row(info, get) for each parameter in
// the order of PyTorch's state_dict, where get(parameters) is its member
// (of a MultiheadAttentionParameters of any element type, const or not).
// A new parameter is one row here (and its field above).
template <class Row>
void multihead_attention_parameter_table(const MultiheadAttentionConfig& c, Row&& row) {
  const int64_t E = c.embed_dim;
  const bool packed = c.same_embed_dim();
  const char* packed_why = "kdim and vdim equal embed_dim, so the packed in_proj_weight is used";
  const char* separate_why = "kdim or vdim differs from embed_dim, so q/k/v_proj_weight are used";
  const auto why = [](bool present, const char* because) { return present ? "" : because; };
  row(ParameterInfo{"in_proj_weight", {3 * E, E}, packed, why(packed, separate_why)},
      [](auto& p) -> auto& { return p.in_proj_weight; });
  row(ParameterInfo{"q_proj_weight", {E, E}, !packed, why(!packed, packed_why)},
      [](auto& p) -> auto& { return p.q_proj_weight; });
  row(ParameterInfo{"k_proj_weight", {E, c.key_dim()}, !packed, why(!packed, packed_why)},
      [](auto& p) -> auto& { return p.k_proj_weight; });
  row(ParameterInfo{"v_proj_weight", {E, c.value_dim()}, !packed, why(!packed, packed_why)},
      [](auto& p) -> auto& { return p.v_proj_weight; });
  row(ParameterInfo{"in_proj_bias", {3 * E}, c.bias, why(c.bias, "bias is false")},
      [](auto& p) -> auto& { return p.in_proj_bias; });
  row(ParameterInfo{"bias_k", {1, 1, E}, c.add_bias_kv, why(c.add_bias_kv, "add_bias_kv is false")},
      [](auto& p) -> auto& { return p.bias_k; });
  row(ParameterInfo{"bias_v", {1, 1, E}, c.add_bias_kv, why(c.add_bias_kv, "add_bias_kv is false")},
      [](auto& p) -> auto& { return p.bias_v; });
  row(ParameterInfo{"out_proj.weight", {E, E}, true, ""}, [](auto& p) -> auto& { return p.out_proj_weight; });
  row(ParameterInfo{"out_proj.bias", {E}, c.bias, why(c.bias, "bias is false")},
      [](auto& p) -> auto& { return p.out_proj_bias; });
}
}  // namespace detail

// The table's rows (multihead/parameter_table.hpp): fn(info) for each.
template <class Fn>
void for_each_parameter(const MultiheadAttentionConfig& config, Fn&& fn) {
  detail::multihead_attention_parameter_table(config, [&](const ParameterInfo& info, auto) { fn(info); });
}
// fn(info, tensor) with each parameter's tensor in `parameters`.
template <class T, class Fn>
void for_each_parameter(const MultiheadAttentionConfig& config, MultiheadAttentionParameters<T>& parameters,
                        Fn&& fn) {
  detail::multihead_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(parameters)); });
}
template <class T, class Fn>
void for_each_parameter(const MultiheadAttentionConfig& config, const MultiheadAttentionParameters<T>& parameters,
                        Fn&& fn) {
  detail::multihead_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(parameters)); });
}
// fn(info, a_tensor, b_tensor): two parameter sets side by side (a cast, a
// gradient beside its parameter).
template <class A, class B, class Fn>
void for_each_parameter(const MultiheadAttentionConfig& config, A& a, B& b, Fn&& fn) {
  detail::multihead_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(a), get(b)); });
}

// The fused form's fast paths, each with a switch to its plain alternative.
// Every setting computes the same function (the tests run the form-agreement
// table under each); they differ in speed and rounding only. The environment
// variable MULTIHEAD_FUSED_PATHS=plain forces every plain alternative for
// the process ("auto" or unset: as the call says).
struct FusedPaths {
  // How split_heads hands the heads to the kernel.
  //  - Auto: strided views into the projection for S < 2048, else
  //    head-major copies (views of long rows thrash the cache: see
  //    multihead_attention_forward.cpp).
  //  - Views: always views, except with bias_k or the zero-attention key,
  //    which need the extra key rows that only a copy has.
  //  - HeadMajor: always copies, projected block by block.
  enum class Heads { Auto, Views, HeadMajor };
  Heads heads = Heads::Auto;
  // Self-attention (query, key and value are one tensor) with packed weights:
  // one (tokens × E)·(E × 3E) product, PyTorch's _in_projection_packed fast
  // case. false: three products, one per input.
  bool packed_self_projection = true;
  // Multiply by the transposed copies of the projection weights that the
  // module keeps (faster for short inputs); false: by the weights as stored.
  bool transposed_weights = true;
};

// Arguments of MultiheadAttention.forward, same names and defaults (plus the
// options PyTorch keeps elsewhere: training mode, policy, kernel, threads).
template <class T>
struct ForwardOptions {
  const Mask<T>* key_padding_mask = nullptr;
  bool need_weights = true;
  const Mask<T>* attn_mask = nullptr;
  bool average_attn_weights = true;
  // PyTorch modules start in training mode; we default to inference, since
  // training-mode dropout is random. Dropout applies only when training, at
  // the rate MultiheadAttentionConfig::dropout.
  bool training = false;
  // The attention step's options: is_causal (and its alignment), window,
  // softcap, dropout_seed, masked_rows, kernel, num_threads, check_finite,
  // scale (unset = 1/√D, as PyTorch). attention.dropout_p must stay 0: the
  // rate is the module's; attention.alibi_slopes must stay empty: use alibi.
  AttentionOptions attention;
  // ALiBi with the paper's slopes per head (alibi_slopes(num_heads) in
  // multihead/attention.hpp): slice n = b·H + h of the attention step, head
  // h of batch entry b, gets slope m_(h+1), the same for every b.
  bool alibi = false;
  // With alibi, for a module that computes a share of a larger module's
  // heads (head parallel, multihead/distributed.hpp): its head h gets the
  // slope of head alibi_head_offset + h of alibi_slopes(alibi_heads). 0 (the
  // default) = this module's own num_heads, offset 0. ALiBi's slopes depend
  // on the global head index; nothing else here does.
  int64_t alibi_heads = 0;
  int64_t alibi_head_offset = 0;
  FusedPaths paths;
  // Which attention weights need_weights returns (docs/explain.md, "Weights
  // from the fused path"): the heads h in [0, H) and the query rows i in
  // [0, L) listed, each at most once, in the order listed; empty = all, in
  // order. The weights are then (B, H', L', S') per head (H' = the heads
  // listed, L' = the rows listed), and averaged (B, L', S'): the mean over
  // the H' selected heads (over all H it is PyTorch's average). Given
  // without need_weights: an error. When the flash kernel serves the call
  // (Auto for float, or kernel = Flash), the weights are recomputed from
  // its saved row log-sum-exps for the selection only: no (L, S) buffer
  // beyond the H'·L'·S' asked for. Otherwise (materialized or reference
  // kernel, or double) the kernel's full weights are computed and the
  // selection copied out of them.
  std::vector<int64_t> weights_heads;
  std::vector<int64_t> weights_rows;
};

template <class T>
struct ForwardResult {
  Tensor<T> output;                      // (L, B, E) / (B, L, E) / (L, E)
  std::optional<Tensor<T>> attn_weights; // present iff need_weights
};

// dℓ/d(everything the forward read), for a given dℓ/d(output).
template <class T>
struct MultiheadAttentionGradients {
  // dℓ/d(input), same shapes (and layout) as the inputs. Self-attention with
  // one tensor passed as query, key and value gets three separate tensors,
  // one per argument: the gradient of that one tensor is their sum (the
  // caller adds them, as autograd would).
  Tensor<T> query, key, value;
  // dℓ/dθ under the state_dict names ("in_proj_weight" or q/k/v_proj_weight,
  // "in_proj_bias", "out_proj.weight", "out_proj.bias", "bias_k", "bias_v"),
  // exactly the keys state_dict() has, each of its parameter's shape.
  std::map<std::string, Tensor<T>> parameters;
};

template <class T>
class BasicMultiheadAttention;

// What a training forward keeps for the backward pass
// (BasicMultiheadAttention::forward with a context, then backward):
//  - the inputs' shapes and the forward's plan (its validation, once);
//  - copies of the inputs (the in-projection's gradient needs them; one copy
//    when query, key and value are one tensor);
//  - the projected Q, K, V as the kernel read them;
//  - the attention output before out_projection (the merged heads);
//  - each attention row's log-sum-exp, (B·H, L): never the (L, S) weights,
//    which the backward recomputes from it (and dropout's keep decisions,
//    which it regenerates from the same seed);
//  - the resolved options: the kernel, paths, dropout rate and seed,
//    is_causal, window, softcap, ALiBi, scale, policy, threads.
//  - the masks as the kernel read them (attn_mask and key_padding_mask,
//    additive, padded for bias_k and zero attention): a copy, so the
//    caller's masks need not outlive the forward;
//  - the kernel the forward ran, chosen once (kernel_force, MULTIHEAD_KERNEL,
//    the options): the backward runs that kernel's backward.
// Move-only. Reusable across steps: a later forward overwrites it, and its
// buffers grow when a shape needs more, never shrink (clear() frees them).
template <class T>
class ForwardContext {
 public:
  ForwardContext();
  ~ForwardContext();
  ForwardContext(ForwardContext&&) noexcept;
  ForwardContext& operator=(ForwardContext&&) noexcept;
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  // True until a training forward has filled it (and after clear()).
  bool empty() const;
  // Bytes of the buffers it holds.
  std::size_t bytes() const;
  // Frees every buffer; the context is empty again.
  void clear();

 private:
  friend class BasicMultiheadAttention<T>;
  std::unique_ptr<detail::SavedForward<T>> saved_;
};

extern template class ForwardContext<float>;
extern template class ForwardContext<double>;

template <class T>
class BasicMultiheadAttention {
 public:
  // Parameters initialised as PyTorch's _reset_parameters does:
  // xavier_uniform_ on in_proj_weight (or each of q/k/v_proj_weight),
  // out_proj.weight as nn.Linear (kaiming_uniform_, a=√5), zero biases,
  // xavier_normal_ on bias_k and bias_v. Draws come from a std::mt19937_64
  // seeded with `seed`, so the numbers differ from torch's but the
  // distributions are the same.
  explicit BasicMultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed = 0);
  // Takes given parameters; throws multihead::Error if any is missing, extra
  // or of the wrong shape (naming it, with expected and actual shape).
  BasicMultiheadAttention(const MultiheadAttentionConfig& config,
                          MultiheadAttentionParameters<T> parameters);

  const MultiheadAttentionConfig& config() const { return config_; }
  const MultiheadAttentionParameters<T>& parameters() const { return params_; }

  // The fused form. Thread-safe: any number of threads may call forward on
  // one object at once. Its scratch buffers (projections, per-head Q/K/V) are
  // kept in a pool and reused by later calls, so a steady state of calls of
  // the same shape allocates nothing but the returned tensors.
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const ForwardOptions<T>& options = {}) const;
  // Same, writing into `result`, whose buffers are reused when large enough
  // (so even the output is not reallocated between calls).
  void forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
               const ForwardOptions<T>& options, ForwardResult<T>& result) const;
  // Training: the same forward (bit-identical output and weights), also
  // filling `save_for_backward` with what backward() needs (ForwardContext
  // above). options.training selects dropout at config().dropout, with
  // options.attention.dropout_seed; the backward regenerates the same keep
  // decisions from that seed.
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const ForwardOptions<T>& options, ForwardContext<T>& save_for_backward) const;
  // The backward pass of that forward: given d_output = dℓ/d(output), of the
  // output's shape, the gradients of the inputs and of every parameter
  // (MultiheadAttentionGradients). The attention weights the forward may
  // have returned are outputs for inspection: no gradient flows back
  // through them. Runs the backward of the kernel the forward ran (chosen
  // at the forward; a force set since does not apply). Throws
  // multihead::Error, naming the argument, if `context` is empty, comes from
  // another module, predates update_parameters(), or if d_output has the
  // wrong shape.
  // Thread-safe as forward() is (scratch from the same pool).
  MultiheadAttentionGradients<T> backward(const ForwardContext<T>& context, const Tensor<T>& d_output) const;
  // Same, writing into `gradients`, whose tensors are reused when they
  // already have the right shapes (nothing is reallocated between steps).
  void backward(const ForwardContext<T>& context, const Tensor<T>& d_output,
                MultiheadAttentionGradients<T>& gradients) const;
  // Calls update(name, tensor) for every parameter under its state_dict name
  // (in state_dict()'s order), e.g. an optimiser step, then checks every
  // parameter's shape (validate_parameters) and rebuilds the derived data
  // (the transposed weight copies). Not thread-safe against concurrent
  // forward/backward calls on this module. Contexts filled before the update
  // are refused by backward() (their gradients would mix old and new
  // weights).
  void update_parameters(const std::function<void(const std::string& name, Tensor<T>& parameter)>& update);
  // For a module constructed over parameters that are views (Tensor::view)
  // of memory its caller owns and changes in place, e.g. a framework's own
  // parameter tensors (python/multihead/torch.py): the module reads them
  // there, with no copy, and after each change in place the caller calls
  // this, which rebuilds the derived data (the transposed copies) from the
  // current values and, as update_parameters, makes earlier contexts stale
  // (backward() refuses them). The scratch pool is kept. Not thread-safe
  // against concurrent forward/backward calls on this module. (Copying or
  // updating such a module gives it owned copies: Tensor's copy rule.)
  void parameters_changed();

  // Frees the pooled scratch buffers (they are rebuilt on demand).
  void release_workspaces() const;
  // The lesson's four steps, one head at a time, in plain loops. Same
  // contract as forward(), except that options.attention.kernel and
  // options.paths are ignored: it always runs the reference kernel.
  ForwardResult<T> forward_textbook(const Tensor<T>& query, const Tensor<T>& key,
                                    const Tensor<T>& value,
                                    const ForwardOptions<T>& options = {}) const;

  // Parameters by state_dict name ("in_proj_weight", "out_proj.weight", …),
  // only those this configuration has (for_each_parameter's present rows).
  std::map<std::string, Tensor<T>> state_dict() const;
  // Takes every parameter from `state_dict` (copies), as PyTorch's
  // load_state_dict(strict=True): a missing, misshapen or unexpected name
  // throws multihead::Error naming it, and leaves the module as it was.
  // Then as update_parameters: derived data rebuilt, earlier contexts stale.
  void load_state_dict(const std::map<std::string, Tensor<T>>& state_dict);

 private:
  // Installs checked parameters: rebuilds weights_t_, draws a new token.
  void replace_parameters(MultiheadAttentionParameters<T> parameters);
  MultiheadAttentionConfig config_;
  MultiheadAttentionParameters<T> params_;
  // The projection weights transposed, as the fused form's products read
  // them fastest (src/attention/projection_weights.hpp). Built once.
  std::shared_ptr<const detail::ProjectionWeights<T>> weights_t_;
  std::shared_ptr<detail::WorkspacePool<T>> workspaces_;
  // A process-unique token for this set of parameter values, drawn anew by
  // the constructors and by update_parameters(). A ForwardContext records
  // it, so backward() refuses a context from another module or from before
  // an update (copies of a module share the token until one is updated,
  // and then their parameters are the same, so the context is valid).
  uint64_t parameters_token_ = 0;
};

extern template class BasicMultiheadAttention<float>;
extern template class BasicMultiheadAttention<double>;

using MultiheadAttention = BasicMultiheadAttention<float>;

// Throws multihead::Error unless every parameter this configuration needs is
// present with the right shape and no other is. Messages name the parameter.
template <class T>
void validate_parameters(const MultiheadAttentionConfig& config,
                         const MultiheadAttentionParameters<T>& parameters);

}  // namespace multihead
