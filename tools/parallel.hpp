// tools/parallel.hpp: `--parallel heads|ring|ulysses` of `multihead forward`
// and `multihead bench` (multihead/distributed.hpp does the work; this file
// only maps the command's tensors onto it).
//
// Under mpirun every rank reads the same files and computes its share; the
// whole result is gathered on every rank and rank 0 writes the outputs
// (writes_outputs()). Each step before the first message runs inside
// agree_on, so an error on any rank (a file one rank cannot read, a bad
// shape) becomes the same one-line error on every rank, printed by rank 0,
// exit 2. Built without MPI, every entry point throws the one-line
// "--parallel: this build has no MPI" error.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {

// "heads", "ring", "ulysses": the values --parallel takes.
inline const char* const kParallelModes[] = {"heads", "ring", "ulysses"};

// Runs `prepare` on this rank; with a mode ("" = none), the ranks then agree
// on its errors (multihead::AgreedError on every rank).
void agree_on(const std::string& mode, const std::function<void()>& prepare);

// Whether this rank writes the outputs: rank 0, or any process without MPI.
bool writes_outputs();

// The whole module's forward, computed by the ranks in `mode`; the whole
// result on every rank.
template <class T>
ForwardResult<T> parallel_mha_forward(const std::string& mode, const MultiheadAttentionConfig& config,
                                      const MultiheadAttentionParameters<T>& parameters, const Tensor<T>& query,
                                      const Tensor<T>& key, const Tensor<T>& value, const ForwardOptions<T>& options);
// `forward --parallel heads`: the head-parallel module of a weights file,
// each rank decoding only its slices (HeadParallelMultiheadAttention::load:
// its parameters take 1/P of the memory); `header` gets the configuration,
// read from the file's header as load_weights reads it. Collective.
template <class T>
class HeadParallelForward {
 public:
  HeadParallelForward(const std::string& weights, const LoadOptions& load, LoadedWeights& header);
  ~HeadParallelForward();
  HeadParallelForward(HeadParallelForward&&) noexcept;
  // The whole result on every rank.
  ForwardResult<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const ForwardOptions<T>& options) const;

 private:
  struct Module;
  std::unique_ptr<Module> module_;
};

// The grouped-query module's (x batch first, (B, L, E)).
template <class T>
Tensor<T> parallel_gqa_forward(const std::string& mode, const GroupedQueryAttention<T>& module, const Tensor<T>& x,
                               const AttentionOptions& options);

// `multihead bench --parallel MODE`: `repeat` timed forward passes and as
// many forward + backward passes of a random float32 module on random
// self-attention input x (the whole input on every rank), after `warmup`
// untimed ones; rank 0 prints one line per rank: compute and communication
// time (medians) and bytes sent per pass.
void parallel_bench(const std::string& mode, const MultiheadAttentionConfig& config, const Tensor<float>& x,
                    const ForwardOptions<float>& options, int warmup, int repeat);

}  // namespace multihead::cli
