// tools/parallel.cpp: see parallel.hpp.
#include "parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "mpi_session.hpp"
#include "multihead/error.hpp"

#if MULTIHEAD_WITH_MPI
#include "multihead/distributed.hpp"
#endif

namespace multihead::cli {

bool writes_outputs() { return world_rank() == 0; }

#if MULTIHEAD_WITH_MPI

void agree_on(const std::string& mode, const std::function<void()>& prepare) {
  if (mode.empty()) return prepare();
  world_communicator().agree(prepare);
}

namespace {

distributed::SequenceMode sequence_mode(const std::string& mode) {
  return mode == "ulysses" ? distributed::SequenceMode::Ulysses : distributed::SequenceMode::Ring;
}

template <class T>
int64_t length_of(const Tensor<T>& t, bool batch_first) {
  return t.size(t.dim() == 3 && batch_first ? 1 : 0);
}

}  // namespace

template <class T>
ForwardResult<T> parallel_mha_forward(const std::string& mode, const MultiheadAttentionConfig& config,
                                      const MultiheadAttentionParameters<T>& parameters, const Tensor<T>& query,
                                      const Tensor<T>& key, const Tensor<T>& value, const ForwardOptions<T>& options) {
  distributed::Communicator& comm = world_communicator();
  if (mode == "heads") {
    const distributed::HeadParallelMultiheadAttention<T> hp(comm, config, parameters);
    return hp.forward(query, key, value, options);
  }
  const distributed::SequenceParallelMultiheadAttention<T> sp(comm, config, parameters, sequence_mode(mode));
  const bool bf = config.batch_first;
  int64_t L = 0, S = 0;
  comm.agree([&] {
    if (query.dim() != 2 && query.dim() != 3)
      throw Error(Error::Kind::Shape, "query: expected 2 or 3 dimensions, got " + shape_to_string(query.shape()));
    L = length_of(query, bf);
    S = length_of(key, bf);
    if (key.dim() != query.dim() || value.dim() != query.dim() || length_of(value, bf) != S)
      throw Error(Error::Kind::Shape, "key, value: expected the query's rank and equal lengths, got " +
                                          shape_to_string(key.shape()) + " and " + shape_to_string(value.shape()));
  });
  const auto q_seg = distributed::ring_segments(L, comm.size(), comm.rank(), sp.order());
  const auto k_seg = distributed::ring_segments(S, comm.size(), comm.rank(), sp.order());
  // Self-attention stays one tensor, so the module sees it as one.
  const Tensor<T> q_r = distributed::take_positions(query, bf, q_seg);
  const bool kq = key.data() == query.data(), vq = value.data() == query.data(), vk = value.data() == key.data();
  const Tensor<T> k_r = kq ? Tensor<T>() : distributed::take_positions(key, bf, k_seg);
  const Tensor<T> v_r = vq || vk ? Tensor<T>() : distributed::take_positions(value, bf, k_seg);
  const Tensor<T>& k_use = kq ? q_r : k_r;
  const Tensor<T>& v_use = vq ? q_r : vk ? k_use : v_r;
  const ForwardResult<T> local = sp.forward(q_r, k_use, v_use, L, S, options);
  ForwardResult<T> whole;
  whole.output = distributed::gather_positions(comm, local.output, bf, L, sp.order());
  return whole;
}

template <class T>
struct HeadParallelForward<T>::Module {
  distributed::HeadParallelMultiheadAttention<T> module;
};

template <class T>
HeadParallelForward<T>::HeadParallelForward(const std::string& weights, const LoadOptions& load,
                                            LoadedWeights& header)
    : module_(std::make_unique<Module>(Module{
          distributed::HeadParallelMultiheadAttention<T>::load(world_communicator(), weights, load, &header)})) {}

template <class T>
ForwardResult<T> HeadParallelForward<T>::forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                                                 const ForwardOptions<T>& options) const {
  return module_->module.forward(query, key, value, options);
}

template <class T>
Tensor<T> parallel_gqa_forward(const std::string& mode, const GroupedQueryAttention<T>& module, const Tensor<T>& x,
                               const AttentionOptions& options) {
  distributed::Communicator& comm = world_communicator();
  if (mode == "heads") {
    const distributed::HeadParallelGroupedQueryAttention<T> hp(comm, module.config(), module.parameters());
    return hp.forward(x, options);
  }
  const distributed::SequenceParallelGroupedQueryAttention<T> sp(comm, module.config(), module.parameters(),
                                                                 sequence_mode(mode));
  const int64_t L = x.size(1);  // x is (B, L, E), batch first
  comm.agree([&] {
    if (comm.size() > L)
      throw Error(Error::Kind::Value, "ranks: expected at most L = " + std::to_string(L) +
                                          " ranks in sequence parallel (each rank needs a query row), got " +
                                          std::to_string(comm.size()));
  });
  const Tensor<T> x_r = distributed::take_positions(x, true, distributed::ring_segments(L, comm.size(), comm.rank(),
                                                                                        sp.order()));
  return distributed::gather_positions(comm, sp.forward(x_r, L, options), true, L, sp.order());
}

void parallel_bench(const std::string& mode, const MultiheadAttentionConfig& config, const Tensor<float>& x,
                    const ForwardOptions<float>& options, int warmup, int repeat) {
  distributed::Communicator& comm = world_communicator();
  const MultiheadAttention whole(config, 1);
  const bool bf = config.batch_first;
  std::optional<distributed::HeadParallelMultiheadAttention<float>> hp;
  std::optional<distributed::SequenceParallelMultiheadAttention<float>> sp;
  Tensor<float> input = x;
  int64_t L = x.size(bf ? 1 : 0);
  if (mode == "heads") {
    hp.emplace(comm, config, whole.parameters());
  } else {
    sp.emplace(comm, config, whole.parameters(), sequence_mode(mode));
    input = distributed::take_positions(x, bf, distributed::ring_segments(L, comm.size(), comm.rank(), sp->order()));
  }
  Tensor<float> d_out;
  // One pass: forward, or forward + backward; returns (compute s, comm s, bytes).
  const auto pass = [&](bool backward) {
    comm.reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    if (hp) {
      distributed::HeadParallelContext<float> ctx;
      ForwardResult<float> r = backward ? hp->forward(input, input, input, options, ctx)
                                        : hp->forward(input, input, input, options);
      if (backward) {
        if (d_out.shape() != r.output.shape()) d_out = Tensor<float>(r.output.shape(), 1e-3f);
        (void)hp->backward(ctx, d_out);
      }
    } else {
      distributed::SequenceParallelContext<float> ctx;
      ForwardResult<float> r = backward ? sp->forward(input, input, input, L, L, options, ctx)
                                        : sp->forward(input, input, input, L, L, options);
      if (backward) {
        if (d_out.shape() != r.output.shape()) d_out = Tensor<float>(r.output.shape(), 1e-3f);
        (void)sp->backward(ctx, d_out);
      }
    }
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const distributed::CommStats s = comm.stats();
    return std::vector<double>{total - s.seconds, s.seconds, static_cast<double>(s.bytes_sent)};
  };
  for (int backward = 0; backward < 2; ++backward) {
    for (int i = 0; i < warmup; ++i) (void)pass(backward != 0);
    std::vector<double> compute, communication;
    double bytes = 0;
    for (int i = 0; i < repeat; ++i) {
      const std::vector<double> p = pass(backward != 0);
      compute.push_back(p[0]);
      communication.push_back(p[1]);
      bytes = p[2];
    }
    std::sort(compute.begin(), compute.end());
    std::sort(communication.begin(), communication.end());
    const double mine[3] = {compute[compute.size() / 2] * 1e3, communication[communication.size() / 2] * 1e3, bytes};
    std::vector<double> all(static_cast<std::size_t>(3 * comm.size()));
    comm.all_gather(mine, all.data(), 3);
    if (comm.rank() == 0)
      for (int r = 0; r < comm.size(); ++r)
        std::printf("parallel=%s pass=%s rank=%d ranks=%d compute_ms=%.4f comm_ms=%.4f bytes_sent=%.0f\n",
                    mode.c_str(), backward ? "forward+backward" : "forward", r, comm.size(), all[3 * r],
                    all[3 * r + 1], all[3 * r + 2]);
  }
}

#else

template <class T>
struct HeadParallelForward<T>::Module {};

template <class T>
HeadParallelForward<T>::HeadParallelForward(const std::string&, const LoadOptions&, LoadedWeights&) {
  require_mpi("--parallel", "heads");
}

template <class T>
ForwardResult<T> HeadParallelForward<T>::forward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,
                                                 const ForwardOptions<T>&) const {
  require_mpi("--parallel", "heads");
  return {};
}

void agree_on(const std::string& mode, const std::function<void()>& prepare) {
  if (!mode.empty()) require_mpi("--parallel", mode);
  prepare();
}

template <class T>
ForwardResult<T> parallel_mha_forward(const std::string& mode, const MultiheadAttentionConfig&,
                                      const MultiheadAttentionParameters<T>&, const Tensor<T>&, const Tensor<T>&,
                                      const Tensor<T>&, const ForwardOptions<T>&) {
  require_mpi("--parallel", mode);
  return {};
}
template <class T>
Tensor<T> parallel_gqa_forward(const std::string& mode, const GroupedQueryAttention<T>&, const Tensor<T>&,
                               const AttentionOptions&) {
  require_mpi("--parallel", mode);
  return {};
}
void parallel_bench(const std::string& mode, const MultiheadAttentionConfig&, const Tensor<float>&,
                    const ForwardOptions<float>&, int, int) {
  require_mpi("--parallel", mode);
}

#endif

template <class T>
HeadParallelForward<T>::~HeadParallelForward() = default;
template <class T>
HeadParallelForward<T>::HeadParallelForward(HeadParallelForward&&) noexcept = default;
template class HeadParallelForward<float>;
template class HeadParallelForward<double>;

template ForwardResult<float> parallel_mha_forward(const std::string&, const MultiheadAttentionConfig&,
                                                   const MultiheadAttentionParameters<float>&, const Tensor<float>&,
                                                   const Tensor<float>&, const Tensor<float>&,
                                                   const ForwardOptions<float>&);
template ForwardResult<double> parallel_mha_forward(const std::string&, const MultiheadAttentionConfig&,
                                                    const MultiheadAttentionParameters<double>&,
                                                    const Tensor<double>&, const Tensor<double>&,
                                                    const Tensor<double>&, const ForwardOptions<double>&);
template Tensor<float> parallel_gqa_forward(const std::string&, const GroupedQueryAttention<float>&,
                                            const Tensor<float>&, const AttentionOptions&);
template Tensor<double> parallel_gqa_forward(const std::string&, const GroupedQueryAttention<double>&,
                                             const Tensor<double>&, const AttentionOptions&);

}  // namespace multihead::cli
