// multihead/distributed.hpp: attention across processes over MPI (the
// target multihead::distributed; the core library never links MPI).
//
// The caller owns MPI: it calls MPI_Init (or MPI_Init_thread) and
// MPI_Finalize, and passes the communicator to use. The library never touches
// MPI_COMM_WORLD and never initialises MPI. A Communicator duplicates the
// caller's communicator (MPI_Comm_dup, collective), so the library's
// messages cannot match the caller's own; destroy it before MPI_Finalize.
//
// The splits (docs/distributed.md draws them):
//  - head parallel (Shoeybi et al. 2019, Megatron-LM): rank r holds heads
//    [h_r, h_r + H_r) with H_r = ⌈H/P⌉ for r < H mod P, else ⌊H/P⌋ (GQA:
//    whole K/V groups), their rows of the in-projection and columns of W^O;
//    one all-reduce ends the forward, one the backward (d_input).
//  - ring (Liu et al. 2023): queries and keys split by position; K/V blocks
//    travel around the ring while the flash kernel works on the current one;
//    partial results merged by log-sum-exp.
//  - Ulysses (Jacobs et al. 2023): an all-to-all turns a sequence split into
//    a head split and back.
//
// Errors: every rank validates before communicating, then the ranks agree
// (Communicator::agree): all throw the same multihead::AgreedError, the
// first failing rank's one-line message.
//
// Legend: P ranks, r this rank, B batch, L query length, S key length,
// E embed width, H heads, Hkv K/V heads, D head width.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead {

// The error every rank throws after Communicator::agree found one: the
// message and kind of the lowest failing rank, `origin` that rank. A program
// prints it on one rank only (rank 0 for the CLI).
class AgreedError : public Error {
 public:
  AgreedError(Kind kind, const std::string& message, int origin) : Error(kind, message), origin_(origin) {}
  int origin() const { return origin_; }

 private:
  int origin_;
};

namespace distributed {

namespace detail {
class SafetensorsSlices;  // src/distributed/safetensors_slices.hpp
}  // namespace detail

// What a communicator has done since it was made (or reset_stats()):
// bytes this rank sent (every message and every collective's share, counted
// as the algorithm moves them), the messages, and the wall time spent inside
// MPI calls and waits (communication that compute did not hide).
struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t messages = 0;
  double seconds = 0.0;
};

// A non-blocking send or receive (possibly several MPI requests, for
// messages past MPI's int count). Wait for it before reading the receive
// buffer or touching the send buffer; the destructor waits if you did not.
class Request {
 public:
  Request() = default;
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();
  bool pending() const { return !requests_.empty(); }

 private:
  friend class Communicator;
  std::vector<MPI_Request> requests_;
};

class Communicator {
 public:
  // Duplicates `comm` (collective over it). The caller keeps `comm`.
  explicit Communicator(MPI_Comm comm);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  // Every rank runs `check` (validation, reading inputs: no communication
  // inside). Then the ranks agree: if any threw a multihead::Error (or
  // std::bad_alloc, as "out of memory"), every rank throws an AgreedError
  // with the message and kind of the lowest such rank. Otherwise returns on
  // every rank. Collective.
  void agree(const std::function<void()>& check);

  // data[i] = the sum over ranks of data[i], the same bits on every rank and
  // for every run: each element is added in rank order 0, 1, …, P − 1
  // ((x_0 + x_1) + x_2 …), whatever MPI's reduction algorithms are. Moves
  // 2·(P − 1)/P·n values per rank (a reduce-scatter by all-to-all, the sums,
  // an all-gather). T: float, double, int64_t.
  template <class T>
  void all_reduce_sum(T* data, int64_t n);
  // The maximum over ranks (exact in any order).
  template <class T>
  void all_reduce_max(T* data, int64_t n);
  // root's n values to every rank.
  template <class T>
  void broadcast(T* data, int64_t n, int root);
  // recv (P·n) = every rank's n values, rank order.
  template <class T>
  void all_gather(const T* send, T* recv, int64_t n);
  // Block j of `send` (n values) goes to rank j; block j of `recv` comes
  // from rank j. send and recv are P·n values and must not overlap.
  template <class T>
  void all_to_all(const T* send, T* recv, int64_t n);
  // Non-blocking point to point, tag >= 0 (below 2^15).
  template <class T>
  Request isend(const T* data, int64_t n, int dest, int tag);
  template <class T>
  Request irecv(T* data, int64_t n, int source, int tag);
  void wait(Request& request);
  // Sends n values to `dest` while receiving n from `source` (a ring step).
  template <class T>
  void sendrecv(const T* send, T* recv, int64_t n, int dest, int source, int tag);
  void barrier();

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  friend class Request;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  CommStats stats_;
};

// The share of `count` items (heads, K/V groups, rows) rank r of P gets:
// ⌈count/P⌉ items for the first count mod P ranks, ⌊count/P⌋ for the
// others, in order. begin() is the first item's index.
struct Share {
  int64_t begin = 0, count = 0;
  int64_t end() const { return begin + count; }
};
Share share_of(int64_t count, int ranks, int rank);

// ---- head parallel -------------------------------------------------------------
// torch.nn.MultiheadAttention with rank r computing heads heads() of H. The
// rank holds, of the whole module's parameters, only
//   W_q, W_k, W_v rows [h·D, (h + H_r)·D) (and those of in_proj_bias),
//   bias_k / bias_v columns [h·D, (h + H_r)·D),
//   out_proj.weight columns [h·D, (h + H_r)·D), and out_proj.bias (whole:
//   added once, after the all-reduce).
// It runs a MultiheadAttention of H_r heads on those slices (the module's
// own forward and backward, every option), with the query projected by its
// rows first and the out-projection by its columns after; one all-reduce
// (Communicator::all_reduce_sum) sums the ranks' out-projections.
//
// Every rank passes the whole inputs (query, key, value, masks: the same on
// every rank) and gets the whole output. attn_mask (B·H, L, S) is sliced to
// the rank's heads; ALiBi takes the global head's slope
// (ForwardOptions::alibi_head_offset). Dropout while training is refused (its
// keep decisions are drawn per global (batch, head) slice), and so are
// weights_heads / weights_rows. need_weights gives the whole weights on every
// rank (an all-reduce of the per-head weights: for inspection, not speed).
template <class T>
struct HeadParallelContext;

template <class T>
class HeadParallelMultiheadAttention {
 public:
  // Throws (on every rank alike, after agreeing) if the configuration is
  // invalid, the parameters do not fit it, or P > H ("ranks: expected at
  // most num_heads = 4 ranks in head parallel, got 6").
  HeadParallelMultiheadAttention(Communicator& comm, const MultiheadAttentionConfig& config,
                                 const MultiheadAttentionParameters<T>& whole);
  // The same, reading from a safetensors file (a whole module's state_dict,
  // names under `prefix` as LoadOptions::prefix) only this rank's blocks:
  // the file is mapped and the other rows are never decoded, so a rank's
  // parameters take 1/P of the memory. `config` is the module's (the file's
  // metadata as load_weights reads it, or the caller's own). Every tensor
  // the configuration has is checked for its shape (an error names it and
  // the file, the same on every rank).
  static HeadParallelMultiheadAttention load(Communicator& comm, const std::string& path,
                                             const MultiheadAttentionConfig& config, const std::string& prefix = "");
  // The same with the configuration, too, read from the file's header as
  // load_weights reads it (options: prefix and overrides; see
  // weights_from_header): no rank decodes more than its blocks. `header`,
  // if given, receives what the header said (config, metadata, assumed
  // settings; no parameters).
  static HeadParallelMultiheadAttention load(Communicator& comm, const std::string& path, const LoadOptions& options,
                                             LoadedWeights* header = nullptr);
  ~HeadParallelMultiheadAttention();
  HeadParallelMultiheadAttention(HeadParallelMultiheadAttention&&) noexcept;

  const MultiheadAttentionConfig& config() const { return config_; }
  Share heads() const { return heads_; }
  // This rank's parameters under the state_dict names, each its slice:
  // in_proj_weight (3·H_r·D, E) (or q/k/v_proj_weight (H_r·D, E / Ek / Ev)),
  // in_proj_bias (3·H_r·D), bias_k / bias_v (1, 1, H_r·D),
  // out_proj.weight (E, H_r·D), out_proj.bias (E).
  std::map<std::string, Tensor<T>> state_dict() const;
  // Parameter values load() decoded from the file on this rank (0 when
  // built from whole parameters): the rank's share, about 1/P of the file.
  uint64_t values_read() const;

  // Collective. Validates on every rank and agrees before communicating.
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const ForwardOptions<T>& options = {}) const;
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const ForwardOptions<T>& options, HeadParallelContext<T>& save) const;
  // Collective. d_output is the whole dℓ/d(output) (the same on every
  // rank). query / key / value: the whole input gradients (all-reduced, one
  // message); parameters: this rank's slices, as state_dict() names them.
  MultiheadAttentionGradients<T> backward(const HeadParallelContext<T>& context, const Tensor<T>& d_output) const;

 private:
  // block(name, first, count, columns): rows [first, first + count) of the
  // named parameter (flattened), or columns of a 2-D one.
  using BlockSource = std::function<Tensor<T>(const std::string&, int64_t, int64_t, bool)>;
  HeadParallelMultiheadAttention(Communicator& comm, const MultiheadAttentionConfig& config,
                                 const std::function<void()>& check, const BlockSource& block);
  // load() from a file already opened (`file`, or opened here when empty):
  // the options' load reads the header and the slices through one opening,
  // so a pipe works as it does for the one-process reader.
  static HeadParallelMultiheadAttention load_opened(Communicator& comm, const std::string& path,
                                                    const MultiheadAttentionConfig& config, const std::string& prefix,
                                                    std::optional<detail::SafetensorsSlices>& file);
  ForwardResult<T> run(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                       const ForwardOptions<T>& options, HeadParallelContext<T>* save) const;
  struct Local;
  Communicator* comm_;
  MultiheadAttentionConfig config_;
  Share heads_;
  std::unique_ptr<Local> local_;
};

// What a head-parallel training forward keeps: the local module's context,
// the query (W_q's gradient reads it) and the rank's merged heads.
template <class T>
struct HeadParallelContext {
  ForwardContext<T> local;
  Tensor<T> query, projected_query, merged;
  Shape query_shape;
};

// The grouped-query module with rank r computing K/V groups groups() of Hkv
// (a K/V head travels with the H/Hkv query heads that read it): rows of
// q/k/v_proj (and their biases) and columns of o_proj; o_proj.bias whole,
// added once after the all-reduce. x is the whole (B, L, E) on every rank;
// so is the output. options as GroupedQueryAttention::forward takes them
// (alibi_slopes: H values, the whole module's; the rank takes its own).
// Dropout is refused (as above). P > Hkv is an error naming both.
template <class T>
class HeadParallelGroupedQueryAttention {
 public:
  HeadParallelGroupedQueryAttention(Communicator& comm, const GroupedQueryAttentionConfig& config,
                                    const GroupedQueryAttentionParameters<T>& whole);
  const GroupedQueryAttentionConfig& config() const { return config_; }
  Share groups() const { return groups_; }
  Share heads() const;
  std::map<std::string, Tensor<T>> state_dict() const;
  Tensor<T> forward(const Tensor<T>& x, const AttentionOptions& options = {}) const;
  Tensor<T> forward(const Tensor<T>& x, const AttentionOptions& options, GroupedQueryForwardContext<T>& save) const;
  // x: the whole dℓ/dx (all-reduced); parameters: this rank's slices.
  GroupedQueryAttentionGradients<T> backward(const GroupedQueryForwardContext<T>& context,
                                             const Tensor<T>& d_output) const;

 private:
  AttentionOptions local_options(const AttentionOptions& options) const;
  // local_options, and check_finite done here at the whole tensors' indices
  // (then off for the local module).
  AttentionOptions checked_options(const Tensor<T>& x, const AttentionOptions& options) const;
  Communicator* comm_;
  GroupedQueryAttentionConfig config_;
  Share groups_;
  std::optional<GroupedQueryAttention<T>> local_;
  Tensor<T> out_bias_;
};

// ---- sequence parallel: ring attention ---------------------------------------
// Positions [0, length) over P ranks.
//  - Contiguous: rank r holds share_of(length, P, r).
//  - ZigZag: 2P chunks (share_of(length, 2P, c)); rank r holds chunks r and
//    2P − 1 − r, so under causal masking every rank has one early and one
//    late chunk and the same work, give or take a chunk's rounding
//    (Brandon et al. 2023 stripe for the same reason; zig-zag keeps chunks
//    contiguous, so each (query chunk, key chunk) pair is one kernel call).
enum class RingOrder { Contiguous, ZigZag };
// The rank's segments in order (one or two; empty ones dropped). A rank's
// rows are its segments' positions, concatenated.
std::vector<Share> ring_segments(int64_t length, int ranks, int rank, RingOrder order);
int64_t ring_rows(int64_t length, int ranks, int rank, RingOrder order);

// One call of ring attention, heads already split (the level of
// scaled_dot_product_attention): N = batch·heads slices; L and S are the whole
// sequence's lengths; the pointers hold this rank's rows, in its segments'
// order (L_r = ring_rows(L, …), S_r = ring_rows(S, …)).
template <class T>
struct RingAttentionInputs {
  int64_t batch = 1, heads = 1, kv_heads = 0;  // kv_heads 0 = heads (grouped-query otherwise)
  int64_t q_len = 0, kv_len = 0;               // L, S
  int64_t head_dim = 0, value_dim = 0;         // D, Dv
  RingOrder order = RingOrder::Contiguous;
  const T* q = nullptr;  // [N][L_r][D]
  const T* k = nullptr;  // [B·Hkv][S_r][D]
  const T* v = nullptr;  // [B·Hkv][S_r][Dv]
  // Additive masks: attn_mask rows of this rank's queries, [M][L_r][S]
  // (M = 1: shared by every slice, or N), columns the whole S; key_padding
  // [B][S] whole (each K/V block reads its columns). nullptr = none.
  const T* attn_mask = nullptr;
  int64_t attn_mask_slices = 1;
  const T* key_padding = nullptr;
  // Keys without a position that every rank holds whole (bias_k / bias_v,
  // the zero-attention key): extra_k [B·Hkv][extra_len][D], extra_v
  // [B·Hkv][extra_len][Dv], after the S keys. Every rank's queries see them
  // as one more block, never sent: no mask column (the masks' zero padding),
  // no causal, window or ALiBi position (score_rule's keys j >= cols).
  const T* extra_k = nullptr;
  const T* extra_v = nullptr;
  int64_t extra_len = 0;
};

// out [N][L_r][Dv] and lse [N][L_r] (each row's log-sum-exp over all S
// keys) of softmax(QKᵀ·scale + masks)V, options as
// scaled_dot_product_attention takes them (is_causal with either alignment
// and causal_query_offset, window, softcap, alibi_slopes: N values, scale,
// masked_rows, kernel, num_threads), in global positions. dropout_p must be
// 0. K/V blocks travel around the ring (rank r sends to r + 1) with
// non-blocking sends while the kernel works on the block at hand; block
// results merge by log-sum-exp; blocks that causal masking (or the window)
// hides entirely are skipped. Collective; validates and agrees first.
template <class T>
void ring_attention_forward(Communicator& comm, const RingAttentionInputs<T>& in, const AttentionOptions& options,
                            T* out, T* lse);
// Its backward: given the forward's out and lse and dℓ/dout (this rank's
// rows), d_q [N][L_r][D], d_k [B·Hkv][S_r][D], d_v [B·Hkv][S_r][Dv] of this
// rank's rows. The K/V blocks travel as in the forward, and with each its
// dK/dV accumulator, which every rank adds its queries' share to; after a
// full turn the accumulators reach their owners. With extra keys,
// d_extra_k / d_extra_v (as extra_k / extra_v; nullptr: not wanted) get this
// rank's queries' share of their gradients (sum them over the ranks).
template <class T>
void ring_attention_backward(Communicator& comm, const RingAttentionInputs<T>& in, const AttentionOptions& options,
                             const T* out, const T* lse, const T* d_out, T* d_q, T* d_k, T* d_v,
                             T* d_extra_k = nullptr, T* d_extra_v = nullptr);

// ---- sequence parallel MultiheadAttention: ring or Ulysses ----------------------
//  - Ring: the projections on the rank's rows, ring_attention_* on its heads,
//    the out-projection on its rows.
//  - Ulysses (Jacobs et al. 2023; P must divide H; contiguous rows): an
//    all-to-all turns the rank's rows of every head into every row of
//    its H/P heads, the kernel runs on those, and a second all-to-all
//    turns the result back.
// Every rank holds the whole parameters. query / key / value are the rank's
// rows (ring_segments(L or S, P, r, order()), concatenated) in the module's
// layout ((L_r, B, E), (B, L_r, E) batch first, or (L_r, E)); attn_mask and
// key_padding_mask are the whole masks (every rank the same; each reads its
// rows). The output is the rank's rows. Parameter gradients are the whole
// module's, on every rank (summed over ranks in rank order). bias_k /
// bias_v and the zero-attention key are keys without a position after the S
// keys, as in the one-process module: ring gives them to every rank as one
// local block (RingAttentionInputs::extra_*), Ulysses appends them to its
// heads' keys. Not supported (refused with an error naming it): dropout
// while training (its keep decisions hash a kernel call's own row and column
// indices, which a ring block does not share with the whole call),
// need_weights.
enum class SequenceMode { Ring, Ulysses };

template <class T>
struct SequenceParallelContext;

template <class T>
class SequenceParallelMultiheadAttention {
 public:
  SequenceParallelMultiheadAttention(Communicator& comm, const MultiheadAttentionConfig& config,
                                     const MultiheadAttentionParameters<T>& whole, SequenceMode mode,
                                     bool causal_balance = true);
  const MultiheadAttentionConfig& config() const { return config_; }
  SequenceMode mode() const { return mode_; }
  // The order of the rows: ZigZag for a ring with causal_balance (the
  // constructor's flag; pass the same to ring_segments), else Contiguous.
  RingOrder order() const { return order_; }
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, int64_t L,
                           int64_t S, const ForwardOptions<T>& options = {}) const;
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, int64_t L,
                           int64_t S, const ForwardOptions<T>& options, SequenceParallelContext<T>& save) const;
  MultiheadAttentionGradients<T> backward(const SequenceParallelContext<T>& context, const Tensor<T>& d_output) const;

 private:
  ForwardResult<T> run(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, int64_t L, int64_t S,
                       const ForwardOptions<T>& options, SequenceParallelContext<T>* save) const;
  Communicator* comm_;
  MultiheadAttentionConfig config_;
  MultiheadAttentionParameters<T> params_;
  SequenceMode mode_;
  RingOrder order_;
};

// The rows at positions `segments` of a whole (len, B, w) / (B, len, w) /
// (len, w) tensor (batch_first as the module's), concatenated: what a rank
// passes to SequenceParallelMultiheadAttention.
template <class T>
Tensor<T> take_positions(const Tensor<T>& whole, bool batch_first, const std::vector<Share>& segments);
// The whole tensor, `len` positions, from every rank's rows
// (ring_segments(len, P, r, order)), on every rank. Collective.
template <class T>
Tensor<T> gather_positions(Communicator& comm, const Tensor<T>& local, bool batch_first, int64_t len,
                           RingOrder order);

// What a sequence-parallel training forward keeps (the rank's rows only).
template <class T>
struct SequenceParallelContext {
  Tensor<T> query, key, value;       // the inputs
  // The heads as the kernels read them (ring: the rank's rows of every
  // head, [N][L_r][D] …; Ulysses: every row of the rank's heads), the
  // attention output and its lse, the masks in kernel layout, the merged
  // heads (rows × E).
  std::vector<T> q, k, v, out, lse, concat;
  std::vector<T> attn_mask, key_padding;
  int64_t attn_mask_slices = 1;
  // bias_k / bias_v, then the zero key, per slice ([B·H][extra][D]; ring).
  std::vector<T> extra_k, extra_v;
  int64_t extra = 0;
  AttentionOptions attention;
  Shape output_shape;
  bool filled = false;
};

// ---- sequence parallel GroupedQueryAttention: ring or Ulysses ----------------------
// The grouped-query module (self-attention, config.causal bottom-right,
// RoPE) with the sequence split across the ranks:
//  - Ring: projections and RoPE (at the rows' global positions) on the
//    rank's rows; ring_attention_* with kv_heads = Hkv (a K/V block carries
//    the rank's rows of every K/V head, read by its group's H/Hkv query
//    heads where it arrives); o_proj on the rank's rows. Zig-zag rows when
//    causal_balance and config.causal.
//  - Ulysses: P must divide Hkv (a K/V head travels with its whole group:
//    rank r takes K/V heads [r·Hkv/P, (r+1)·Hkv/P) and the query heads
//    [r·H/P, (r+1)·H/P) that read them); otherwise an error naming both.
// x is the rank's rows (B, L_r, E) of the whole (B, L, E) (batch first, as
// the module; rows ring_segments(L, P, r, order())); the output is the
// rank's rows. options as GroupedQueryAttention::forward takes them
// (alibi_slopes: H values, the module's); dropout_p must be 0. Every rank
// holds the whole parameters; backward gives the rank's rows of dℓ/dx and
// the whole module's parameter gradients on every rank (summed in rank
// order).
template <class T>
struct SequenceParallelGqaContext;

template <class T>
class SequenceParallelGroupedQueryAttention {
 public:
  SequenceParallelGroupedQueryAttention(Communicator& comm, const GroupedQueryAttentionConfig& config,
                                        const GroupedQueryAttentionParameters<T>& whole, SequenceMode mode,
                                        bool causal_balance = true);
  const GroupedQueryAttentionConfig& config() const { return config_; }
  SequenceMode mode() const { return mode_; }
  RingOrder order() const { return order_; }
  Tensor<T> forward(const Tensor<T>& x, int64_t L, const AttentionOptions& options = {}) const;
  Tensor<T> forward(const Tensor<T>& x, int64_t L, const AttentionOptions& options,
                    SequenceParallelGqaContext<T>& save) const;
  GroupedQueryAttentionGradients<T> backward(const SequenceParallelGqaContext<T>& context,
                                             const Tensor<T>& d_output) const;

 private:
  Tensor<T> run(const Tensor<T>& x, int64_t L, const AttentionOptions& options,
                SequenceParallelGqaContext<T>* save) const;
  Communicator* comm_;
  GroupedQueryAttentionConfig config_;
  GroupedQueryAttentionParameters<T> params_;
  SequenceMode mode_;
  RingOrder order_;
};

// What its training forward keeps (the rank's rows; Ulysses: q, k, v, out
// and lse of its heads' every row).
template <class T>
struct SequenceParallelGqaContext {
  Tensor<T> x;
  std::vector<T> q, k, v, out, lse, merged;
  AttentionOptions attention;  // as the kernels ran (causal, this rank's slopes)
  int64_t L = 0;
  bool filled = false;
};

}  // namespace distributed
}  // namespace multihead
