// multihead/grouped_query_attention.hpp: grouped-query attention (GQA,
// Ainslie et al. 2023) and its KV cache for incremental decoding, as
// Llama- and Mistral-style models use it. PyTorch's nn.MultiheadAttention
// has no K/V-head count, so this module has its own configuration and the
// weight names of that common layout (Hugging Face LlamaAttention):
//   q_proj.weight (H·D, E)     q_proj.bias (H·D)     optional
//   k_proj.weight (Hkv·D, E)   k_proj.bias (Hkv·D)   optional
//   v_proj.weight (Hkv·D, E)   v_proj.bias (Hkv·D)   optional
//   o_proj.weight (E, H·D)     o_proj.bias (E)       optional
// Query head h uses K/V head h / (H / Hkv) (repeat_kv's order). Multi-query
// attention (Shazeer 2019) is num_kv_heads = 1; num_kv_heads = num_heads is
// multi-head attention with separate projections.
//
// Legend: B batch, L new tokens, P tokens already cached, S = P + L keys,
// E embed width, H query heads, Hkv K/V heads, D head width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "multihead/attention.hpp"
#include "multihead/parameter_table.hpp"
#include "multihead/positions.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

struct GroupedQueryAttentionConfig {
  int64_t embed_dim = 0;     // E >= 1
  int64_t num_heads = 0;     // H >= 1
  int64_t num_kv_heads = 0;  // Hkv, divides H; 0 = H
  int64_t head_dim = 0;      // D; 0 = E / H (then H must divide E)
  bool bias = false;         // all four projections have biases (Llama: none)
  // Rotary embedding of q and k after their projections (Llama); its
  // position_offset must be 0: positions come from the cache.
  std::optional<RopeOptions> rope;
  // Causal masking, bottom-right aligned: the L new tokens are positions
  // P … P + L − 1 and see every earlier position (and, with a window, the
  // last `window` of them). Without a cache P = 0.
  bool causal = true;

  int64_t resolved_kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : (num_heads > 0 ? embed_dim / num_heads : 0);
  }
  // Throws multihead::Error naming the field, expected and actual value:
  // embed_dim/num_heads < 1, num_kv_heads not dividing num_heads (or < 0),
  // head_dim < 0, H not dividing E when head_dim is 0, and RoPE with an odd
  // head width, theta <= 0 or a position offset.
  void validate() const;
};

// The learnable tensors, under their state_dict names ("q_proj.weight", …).
template <class T>
struct GroupedQueryAttentionParameters {
  Tensor<T> q_proj_weight;  // (H·D, E)    "q_proj.weight"
  Tensor<T> q_proj_bias;    // (H·D)       "q_proj.bias",  when bias
  Tensor<T> k_proj_weight;  // (Hkv·D, E)  "k_proj.weight"
  Tensor<T> k_proj_bias;    // (Hkv·D)     "k_proj.bias",  when bias
  Tensor<T> v_proj_weight;  // (Hkv·D, E)  "v_proj.weight"
  Tensor<T> v_proj_bias;    // (Hkv·D)     "v_proj.bias",  when bias
  Tensor<T> o_proj_weight;  // (E, H·D)    "o_proj.weight"
  Tensor<T> o_proj_bias;    // (E)         "o_proj.bias",  when bias
};

namespace detail {
// The parameter table, written once, in the order of Hugging Face's
// LlamaAttention state_dict: row(info, get), get(parameters) its member.
template <class Row>
void grouped_query_attention_parameter_table(const GroupedQueryAttentionConfig& c, Row&& row) {
  const int64_t E = c.embed_dim, HD = c.num_heads * c.resolved_head_dim();
  const int64_t KD = c.resolved_kv_heads() * c.resolved_head_dim();
  const char* why = c.bias ? "" : "bias is false";
  row(ParameterInfo{"q_proj.weight", {HD, E}, true, ""}, [](auto& p) -> auto& { return p.q_proj_weight; });
  row(ParameterInfo{"q_proj.bias", {HD}, c.bias, why}, [](auto& p) -> auto& { return p.q_proj_bias; });
  row(ParameterInfo{"k_proj.weight", {KD, E}, true, ""}, [](auto& p) -> auto& { return p.k_proj_weight; });
  row(ParameterInfo{"k_proj.bias", {KD}, c.bias, why}, [](auto& p) -> auto& { return p.k_proj_bias; });
  row(ParameterInfo{"v_proj.weight", {KD, E}, true, ""}, [](auto& p) -> auto& { return p.v_proj_weight; });
  row(ParameterInfo{"v_proj.bias", {KD}, c.bias, why}, [](auto& p) -> auto& { return p.v_proj_bias; });
  row(ParameterInfo{"o_proj.weight", {E, HD}, true, ""}, [](auto& p) -> auto& { return p.o_proj_weight; });
  row(ParameterInfo{"o_proj.bias", {E}, c.bias, why}, [](auto& p) -> auto& { return p.o_proj_bias; });
}
}  // namespace detail

// The table's rows, as for MultiheadAttention (multihead/parameter_table.hpp).
template <class Fn>
void for_each_parameter(const GroupedQueryAttentionConfig& config, Fn&& fn) {
  detail::grouped_query_attention_parameter_table(config, [&](const ParameterInfo& info, auto) { fn(info); });
}
template <class T, class Fn>
void for_each_parameter(const GroupedQueryAttentionConfig& config, GroupedQueryAttentionParameters<T>& parameters,
                        Fn&& fn) {
  detail::grouped_query_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(parameters)); });
}
template <class T, class Fn>
void for_each_parameter(const GroupedQueryAttentionConfig& config,
                        const GroupedQueryAttentionParameters<T>& parameters, Fn&& fn) {
  detail::grouped_query_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(parameters)); });
}
template <class A, class B, class Fn>
void for_each_parameter(const GroupedQueryAttentionConfig& config, A& a, B& b, Fn&& fn) {
  detail::grouped_query_attention_parameter_table(
      config, [&](const ParameterInfo& info, auto get) { fn(info, get(a), get(b)); });
}

// What a KV cache stores per element (docs/decoding.md has their bytes and
// the error bound each gives the decode output):
//  - Native: T itself (float32 in KVCache<float>, float64 in KVCache<double>);
//  - BFloat16, Float16: 2 bytes, rounded to nearest even; Float16 refuses a
//    K/V value beyond its range (|x| > 65504);
//  - Int8: 1 byte, symmetric, with one float32 scale per block of 32 values
//    of one head's row of one token (scale = max|x| / 127, round to nearest
//    even): (D + 4·ceil(D / 32)) bytes per row.
// The compressed ones exist for KVCache<float>; the decode kernel reads them
// directly and widens them in registers (no float32 copy of the cache).
enum class KVCacheDType { Native, BFloat16, Float16, Int8 };

// "f32" (Native), "bf16", "f16", "int8": the names `multihead decode
// --cache-dtype` takes (Native of a double cache is also "f32" here: the
// command line has only float caches).
const char* kv_cache_dtype_name(KVCacheDType dtype);

// The K/V of every token seen so far, for a batch of B sequences that
// advance together: K and V [B][Hkv][capacity][D], positions 0 … length − 1
// filled, in dtype() (int8 also holds scales [B][Hkv][capacity][ceil(D/32)]
// for each of K and V). Preallocated to max_len. When an append needs more
// positions than it has: with grow = true it grows, to max(2 x capacity,
// positions needed), copying what it holds; otherwise it throws an Error
// naming max_len. A capacity whose K and V would not fit in the machine's
// memory is refused with an Error naming max_len, the bytes and the memory,
// before anything is allocated. K is stored after RoPE, as Llama's cache.
template <class T>
class KVCache {
 public:
  // A compressed dtype for T = double throws an Error naming cache_dtype.
  KVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t max_len, bool grow = false,
          KVCacheDType dtype = KVCacheDType::Native);

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  bool grows() const { return grow_; }
  KVCacheDType dtype() const { return dtype_; }
  bool compressed() const { return dtype_ != KVCacheDType::Native; }
  // Bytes the cache holds (K and V at capacity, with the int8 scales), which
  // is what it occupies.
  int64_t bytes() const { return static_cast<int64_t>(bytes_for(batch_, kv_heads_, head_dim_, capacity_, dtype_)); }
  // The bytes of a cache of this shape: 2·B·Hkv·capacity·row_bytes(D), as a
  // double, which cannot overflow.
  static double bytes_for(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t capacity,
                          KVCacheDType dtype = KVCacheDType::Native) {
    return 2.0 * static_cast<double>(batch) * static_cast<double>(kv_heads) * static_cast<double>(capacity) *
           row_bytes(head_dim, dtype);
  }
  // Bytes of one head's K (or V) row of one token: D·sizeof(T), 2·D, or
  // D + 4·ceil(D / 32) for int8.
  static double row_bytes(int64_t head_dim, KVCacheDType dtype) {
    const double d = static_cast<double>(head_dim);
    switch (dtype) {
      case KVCacheDType::BFloat16:
      case KVCacheDType::Float16: return 2.0 * d;
      case KVCacheDType::Int8: return d + 4.0 * static_cast<double>((head_dim + 31) / 32);
      case KVCacheDType::Native: break;
    }
    return d * static_cast<double>(sizeof(T));
  }
  // Forget every token (keeps the memory).
  void clear() { length_ = 0; }

  // Makes room for `count` more tokens (grows or throws), without changing
  // length(); then k_row/v_row (Native) or store (compressed) address
  // position p < length() + count.
  void reserve_more(int64_t count);
  // Marks `count` reserved positions filled.
  void commit(int64_t count) { length_ += count; }
  // Native only (empty storage otherwise).
  T* k_row(int64_t b, int64_t g, int64_t p) { return k_.data() + ((b * kv_heads_ + g) * capacity_ + p) * head_dim_; }
  T* v_row(int64_t b, int64_t g, int64_t p) { return v_.data() + ((b * kv_heads_ + g) * capacity_ + p) * head_dim_; }
  const T* k_data() const { return k_.data(); }
  const T* v_data() const { return v_.data(); }

  // Compressed only: rounds (or quantizes) one head's K and V rows of D
  // values into reserved position p of sequence b, K/V head g.
  void store(int64_t b, int64_t g, int64_t p, const T* k, const T* v);
  // Compressed only: the stored elements, [B][Hkv][capacity][D] of 2-byte
  // bit patterns (bf16, f16) or int8 values, and the int8 scales,
  // [B][Hkv][capacity][ceil(D / 32)] (nullptr otherwise).
  const void* k_compressed() const { return k_narrow_.data(); }
  const void* v_compressed() const { return v_narrow_.data(); }
  const float* k_scales() const { return k_scale_.empty() ? nullptr : k_scale_.data(); }
  const float* v_scales() const { return v_scale_.empty() ? nullptr : v_scale_.data(); }

 private:
  void allocate(int64_t capacity);  // zeroed storage for `capacity` positions
  int64_t batch_, kv_heads_, head_dim_, capacity_, length_ = 0;
  bool grow_;
  KVCacheDType dtype_;
  Storage<T> k_, v_;                  // Native
  Storage<uint8_t> k_narrow_, v_narrow_;  // compressed: elements
  Storage<float> k_scale_, v_scale_;  // Int8: scales
};

extern template class KVCache<float>;
extern template class KVCache<double>;

template <class T>
class GroupedQueryAttention;

// What a training forward keeps for the backward pass
// (GroupedQueryAttention::forward with a context, then backward): a copy of
// x; the projected q, k (after RoPE) and v as the kernel read them,
// (B·L, H·D) and (B·L, Hkv·D) ×2; the merged heads before o_proj,
// (B·L, H·D); each attention row's log-sum-exp, (B·H, L), never the (L, S)
// weights (the backward recomputes them, and dropout's keep decisions from
// the same seed); the options; and which parameters it was filled with.
// Opaque, as MultiheadAttention's ForwardContext. A later forward
// overwrites it.
template <class T>
class GroupedQueryForwardContext {
 public:
  // True until a training forward has filled it (and after clear()).
  bool empty() const { return x_.empty(); }
  // Bytes of the tensors it holds.
  std::size_t bytes() const {
    return static_cast<std::size_t>(x_.numel() + q_.numel() + k_.numel() + v_.numel() + merged_.numel() +
                                    lse_.numel()) * sizeof(T);
  }
  // Frees every tensor; the context is empty again.
  void clear() { *this = GroupedQueryForwardContext(); }

 private:
  friend class GroupedQueryAttention<T>;
  Tensor<T> x_, q_, k_, v_, merged_, lse_;
  AttentionOptions options_;
  AttentionKernel kernel_ = AttentionKernel::Auto;  // the kernel the forward ran: the backward runs its backward
  uint64_t parameters_token_ = 0;                    // the module's, when filled
};

// dℓ/d(everything the forward read), for a given dℓ/d(output).
template <class T>
struct GroupedQueryAttentionGradients {
  Tensor<T> x;  // (B, L, E)
  // Under the state_dict names: q_proj.weight, k_proj.weight,
  // v_proj.weight, o_proj.weight (and the four biases with config.bias),
  // each of its parameter's shape.
  std::map<std::string, Tensor<T>> parameters;
};

template <class T>
class GroupedQueryAttention {
 public:
  // Random weights, seeded: each projection as nn.Linear's default
  // (kaiming_uniform_(a=√5): U(−1/√fan_in, 1/√fan_in)), biases U(same).
  explicit GroupedQueryAttention(const GroupedQueryAttentionConfig& config, uint64_t seed = 0);
  // Takes given parameters; throws multihead::Error if any is missing, extra
  // or of the wrong shape (naming it, with expected and actual shape).
  GroupedQueryAttention(const GroupedQueryAttentionConfig& config, GroupedQueryAttentionParameters<T> parameters);

  // The parameters under prefix + <state_dict name> in `tensors` (e.g.
  // "model.layers.0.self_attn."), which may hold other tensors besides.
  // Throws an Error naming a missing or misshapen tensor, or a bias present
  // when config.bias is false.
  static GroupedQueryAttention from_tensors(const GroupedQueryAttentionConfig& config,
                                            const std::map<std::string, Tensor<T>>& tensors,
                                            const std::string& prefix = "");
  // The parameters under their names (no prefix), to save or inspect:
  // for_each_parameter's present rows.
  std::map<std::string, Tensor<T>> state_dict() const;
  // Takes every parameter from `state_dict` (copies), as PyTorch's
  // load_state_dict(strict=True): a missing, misshapen or unexpected name
  // throws an Error naming it and leaves the module as it was. Contexts
  // filled before are refused by backward().
  void load_state_dict(const std::map<std::string, Tensor<T>>& state_dict);
  // Calls update(name, tensor) for every parameter under its state_dict
  // name (in state_dict()'s order), e.g. an optimiser step, then checks
  // every shape; an update that throws or reshapes a parameter (refused,
  // naming it) leaves the module as it was. The module keeps no data
  // derived from its parameters, so nothing else is rebuilt. Not
  // thread-safe against concurrent forward/backward calls on this module.
  // Contexts filled before the update are refused by backward().
  void update_parameters(const std::function<void(const std::string& name, Tensor<T>& parameter)>& update);

  const GroupedQueryAttentionConfig& config() const { return config_; }
  const GroupedQueryAttentionParameters<T>& parameters() const { return params_; }
  int64_t head_dim() const { return config_.resolved_head_dim(); }
  int64_t kv_heads() const { return config_.resolved_kv_heads(); }

  // A cache for `batch` sequences of up to max_len tokens.
  KVCache<T> make_cache(int64_t batch, int64_t max_len, bool grow = false,
                        KVCacheDType dtype = KVCacheDType::Native) const;

  // x (B, L, E), batch first. Without a cache: self-attention over the L
  // tokens at positions 0 … L − 1. With one: K/V of x are appended to it
  // (positions P … P + L − 1, P = cache->length()) and the L queries attend
  // to all P + L keys; the result equals the rows P … P + L − 1 of the
  // forward over the whole prefix. Returns (B, L, E).
  //
  // With a compressed cache (cache->compressed(), float only) the new K/V
  // are rounded into it first and all S keys are read from it: the decode
  // kernel (src/simd/decode_compressed-inl.h) widens them in registers,
  // softmax and its running max in float32; options.kernel must be Auto,
  // and dropout is refused (each an Error naming the option). Its output is
  // within docs/decoding.md's bound of the float32 cache's. A float32
  // cache's decode steps (at most 8 query rows per K/V head, options.kernel
  // Auto and no kernel forced, no dropout) run the same decode kernel; more
  // rows (its prompt) run flash, and a forced kernel runs as asked.
  //
  // From `options` the module takes scale, window, softcap, alibi_slopes
  // (H values, one per query head: alibi_slopes(H) for the paper's),
  // dropout_p/dropout_seed, masked_rows, kernel, num_threads and
  // check_finite (x and every weight). Causal masking and positions are its own (config.causal,
  // bottom-right): options.is_causal, causal_alignment and
  // causal_query_offset must be left at their defaults.
  Tensor<T> forward(const Tensor<T>& x, const AttentionOptions& options = {}, KVCache<T>* cache = nullptr) const;

  // Training (no cache: self-attention over positions 0 … L − 1): the same
  // forward (bit-identical output), also filling `save_for_backward`.
  Tensor<T> forward(const Tensor<T>& x, const AttentionOptions& options,
                    GroupedQueryForwardContext<T>& save_for_backward) const;
  // The backward pass of that forward: given d_output = dℓ/d(output),
  // (B, L, E), dℓ/dx and dℓ/dθ for every weight. K/V heads get the sum
  // over their group's query heads (the kernels' grouped backward), RoPE
  // its transpose (rotary_embedding_backward). Throws an Error naming
  // d_output if its shape is not the output's, or `context` if it is empty,
  // comes from another module or predates update_parameters() /
  // load_state_dict().
  GroupedQueryAttentionGradients<T> backward(const GroupedQueryForwardContext<T>& context,
                                             const Tensor<T>& d_output) const;

 private:
  Tensor<T> run(const Tensor<T>& x, const AttentionOptions& options, KVCache<T>* cache,
                GroupedQueryForwardContext<T>* save) const;
  GroupedQueryAttentionConfig config_;
  GroupedQueryAttentionParameters<T> params_;
  // A process-unique token for this set of parameter values, drawn anew by
  // the constructors, load_state_dict() and update_parameters(); a context
  // records it, so backward() refuses one from another module or from
  // before an update (as MultiheadAttention's).
  uint64_t parameters_token_ = 0;
};

extern template class GroupedQueryAttention<float>;
extern template class GroupedQueryAttention<double>;

}  // namespace multihead
