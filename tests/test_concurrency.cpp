// tests/test_concurrency.cpp: one module, many threads.
//
// The header promises that any number of threads may call forward() on one
// BasicMultiheadAttention at once (include/multihead/multihead_attention.hpp).
// The state those calls share is the parameters (read only) and the
// workspace pool (src/attention/workspace.hpp: a mutex-protected free list
// of grow-only scratch buffers). These tests run a table of calls of mixed
// shapes and options from several std::threads on one object and require
// every result to be bit-identical to the same call made serially. The
// object starts with an empty pool and the shapes differ, so workspaces are
// created, handed from thread to thread and grown while other threads run;
// one thread also empties the pool now and then (release_workspaces).
//
// "Bit-identical", not "close": every call computes its rows with the same
// operations in the same order whatever else runs, so anything but equal
// bytes is a race (or shared state leaking between calls). The same holds
// across ForwardOptions::num_threads (STYLE.md habit 9: one thread writes
// each output row), checked at the end.
//
// scripts/tsan.sh runs these under ThreadSanitizer, with LLVM's Archer
// making the OpenMP runtime's synchronisation visible to it.
//
// Legend: B batch, L query length, S key length, E embed_dim, H heads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multihead/multihead_attention.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::random_tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- the calls ---------------------------------------------------------------

enum class MaskKind { None, Bool2d, Float3d };

// One forward call: its shape and every option that selects a different path.
struct Call {
  int64_t B, L, S;
  bool cross;          // key/value are their own tensors (else q = k = v, L = S)
  bool need_weights;
  bool average;        // average_attn_weights
  MaskKind mask;
  bool key_padding;    // boolean key_padding_mask
  bool causal;
  bool training;       // dropout (the modules have dropout > 0)
  AttentionKernel kernel;
  bool textbook;       // forward_textbook instead of forward
  int threads;         // ForwardOptions::num_threads

  std::string name() const {
    std::string n = std::string(textbook ? "textbook" : "fused") + "_B" + std::to_string(B) + "_L" +
                    std::to_string(L) + "_S" + std::to_string(S) + (cross ? "_cross" : "_self");
    if (need_weights) n += average ? "_weights" : "_perhead";
    static const char* kMasks[] = {"", "_mask2dbool", "_mask3dfloat"};
    n += kMasks[static_cast<int>(mask)];
    if (key_padding) n += "_kpm";
    if (causal) n += "_causal";
    if (training) n += "_dropout";
    return n + "_" + to_string(kernel) + "_t" + std::to_string(threads);
  }
};

using K = AttentionKernel;

// Shapes differ by up to ~50x in scratch size so pooled buffers keep growing.
// L·S > 16384 in the 160×144 rows, where the materialized kernel opens its
// OpenMP region; the flash kernel opens one whenever it has 2+ work items.
// Flash appears only where it is valid: float32 and need_weights = false.
const Call kFloatCalls[] = {
    {2, 5, 5, false, true, true, MaskKind::None, false, false, false, K::Auto, false, 0},
    {1, 160, 144, true, false, true, MaskKind::None, true, true, false, K::Flash, false, 2},
    {3, 17, 17, false, false, true, MaskKind::Bool2d, true, false, false, K::Auto, false, 2},
    {1, 160, 144, true, true, false, MaskKind::Float3d, false, true, false, K::Materialized, false, 2},
    {2, 33, 9, true, true, true, MaskKind::Bool2d, true, true, true, K::Reference, false, 1},
    {4, 64, 64, false, false, true, MaskKind::None, false, true, true, K::Flash, false, 0},
    {2, 7, 11, true, true, false, MaskKind::Float3d, true, false, false, K::Auto, true, 0},
    {1, 96, 96, false, true, true, MaskKind::None, true, true, false, K::Materialized, false, 0},
    {2, 40, 24, true, false, true, MaskKind::Float3d, true, false, true, K::Auto, false, 2},
    {1, 1, 1, false, true, true, MaskKind::None, false, false, false, K::Auto, false, 1},
    {3, 12, 30, true, false, true, MaskKind::Bool2d, false, true, false, K::Flash, true, 2},
};

// The float64 module has kdim/vdim != E (separate projections), bias_k/v and
// a zero-attention key, so its calls are all cross-attention; no flash.
const Call kDoubleCalls[] = {
    {2, 6, 9, true, true, true, MaskKind::None, false, false, false, K::Auto, false, 0},
    {1, 150, 130, true, true, false, MaskKind::Float3d, true, true, false, K::Materialized, false, 2},
    {3, 20, 5, true, false, true, MaskKind::Bool2d, true, false, true, K::Reference, false, 1},
    {2, 48, 48, true, false, true, MaskKind::None, false, true, true, K::Auto, false, 2},
    {1, 9, 33, true, true, true, MaskKind::Float3d, false, true, false, K::Auto, true, 0},
    {4, 3, 70, true, true, false, MaskKind::Bool2d, true, false, true, K::Materialized, false, 0},
    {1, 1, 1, true, false, true, MaskKind::None, false, false, false, K::Auto, false, 1},
};

MultiheadAttentionConfig float_config() {
  MultiheadAttentionConfig c;
  c.embed_dim = 32;
  c.num_heads = 4;
  c.dropout = 0.1;
  return c;
}

MultiheadAttentionConfig double_config() {
  MultiheadAttentionConfig c;
  c.embed_dim = 24;
  c.num_heads = 3;
  c.kdim = 16;
  c.vdim = 20;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  c.batch_first = true;
  c.dropout = 0.2;
  return c;
}

// A call's inputs, built once and only read by the threads.
template <class T>
struct Prepared {
  Call call;
  Tensor<T> q, k, v;
  std::unique_ptr<Mask<T>> attn_mask, key_padding;
  ForwardOptions<T> options;
  ForwardResult<T> expected;  // the call made serially, on a twin module
};

template <class T>
std::unique_ptr<Prepared<T>> prepare(const Call& c, const MultiheadAttentionConfig& cfg,
                                     std::mt19937_64& rng) {
  auto p = std::make_unique<Prepared<T>>();
  p->call = c;
  const int64_t E = cfg.embed_dim, H = cfg.num_heads;
  const int64_t S = c.cross ? c.S : c.L;
  const auto shape = [&](int64_t len, int64_t width) {
    return cfg.batch_first ? Shape{c.B, len, width} : Shape{len, c.B, width};
  };
  p->q = random_tensor<T>(shape(c.L, E), rng);
  if (c.cross) {
    p->k = random_tensor<T>(shape(S, cfg.key_dim()), rng);
    p->v = random_tensor<T>(shape(S, cfg.value_dim()), rng);
  }
  // Masks cover the S given keys; bias_k and zero attention are appended
  // after them by the module (so S here, not S').
  std::bernoulli_distribution drop(0.3);
  if (c.mask == MaskKind::Bool2d) {
    Tensor<uint8_t> m({c.L, S});
    for (auto& x : m.vec()) x = drop(rng);
    p->attn_mask = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
  } else if (c.mask == MaskKind::Float3d) {
    p->attn_mask = std::make_unique<Mask<T>>(Mask<T>::additive(random_tensor<T>({c.B * H, c.L, S}, rng)));
  }
  if (c.key_padding) {
    Tensor<uint8_t> m({c.B, S});
    for (auto& x : m.vec()) x = drop(rng);
    p->key_padding = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
  }
  ForwardOptions<T>& o = p->options;
  o.attn_mask = p->attn_mask.get();
  o.key_padding_mask = p->key_padding.get();
  o.need_weights = c.need_weights;
  o.average_attn_weights = c.average;
  o.attention.is_causal = c.causal;
  o.training = c.training;
  o.attention.dropout_seed = 1234;
  o.attention.kernel = c.kernel;
  o.attention.num_threads = c.threads;
  return p;
}

template <class T>
const Tensor<T>& key_of(const Prepared<T>& p) { return p.call.cross ? p.k : p.q; }
template <class T>
const Tensor<T>& value_of(const Prepared<T>& p) { return p.call.cross ? p.v : p.q; }

template <class T>
ForwardResult<T> run(const BasicMultiheadAttention<T>& m, const Prepared<T>& p) {
  return p.call.textbook ? m.forward_textbook(p.q, key_of(p), value_of(p), p.options)
                         : m.forward(p.q, key_of(p), value_of(p), p.options);
}

// ---- bitwise comparison ------------------------------------------------------

// "" if `got` has the shape and the exact bytes of `want` (NaN payloads
// included), else the shapes or the first differing index and both values.
template <class T>
std::string bitwise_difference(const Tensor<T>& got, const Tensor<T>& want) {
  if (got.shape() != want.shape())
    return "shape " + shape_to_string(got.shape()) + ", expected " + shape_to_string(want.shape());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      std::ostringstream s;
      s.precision(17);
      s << "index " << i << ": " << got[i] << ", expected " << want[i] << " (serial)";
      return s.str();
    }
  }
  return "";
}

template <class T>
std::string result_difference(const ForwardResult<T>& got, const ForwardResult<T>& want) {
  std::string d = bitwise_difference(got.output, want.output);
  if (!d.empty()) return "output " + d;
  if (got.attn_weights.has_value() != want.attn_weights.has_value())
    return std::string("attn_weights ") + (got.attn_weights ? "present" : "absent") + ", expected " +
           (want.attn_weights ? "present" : "absent");
  if (got.attn_weights) {
    d = bitwise_difference(*got.attn_weights, *want.attn_weights);
    if (!d.empty()) return "attn_weights " + d;
  }
  return "";
}

// ---- many threads, one module --------------------------------------------------

constexpr int kThreads = 4;
constexpr int kCallsPerThread = 20;

// Thread t makes kCallsPerThread calls, walking the table from its own start
// with a step prime to its length, so at any moment the threads are on
// different shapes. Odd calls use the overload that reuses the thread's own
// ForwardResult, so its buffers are recycled across shapes too. Thread 0
// empties the pool every 7 calls, while the other threads hold or return
// workspaces. Mismatches and exceptions are collected and reported from the
// main thread.
template <class T, std::size_t N>
void check_threads_match_serial(const MultiheadAttentionConfig& cfg, const Call (&calls)[N], uint64_t seed) {
  std::mt19937_64 rng(seed);
  const BasicMultiheadAttention<T> shared(cfg, seed);
  const BasicMultiheadAttention<T> twin(cfg, shared.parameters());  // same numbers, own pool
  std::vector<std::unique_ptr<Prepared<T>>> prepared;
  for (const Call& c : calls) {
    prepared.push_back(prepare<T>(c, cfg, rng));
    prepared.back()->expected = run(twin, *prepared.back());
  }

  std::vector<std::vector<std::string>> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ForwardResult<T> reused;
      for (int j = 0; j < kCallsPerThread; ++j) {
        const Prepared<T>& p = *prepared[static_cast<std::size_t>(t * 3 + j * 5) % N];
        const std::string where = "thread " + std::to_string(t) + " call " + std::to_string(j) + " " +
                                  p.call.name() + ": ";
        try {
          std::string diff;
          if (j % 2 == 1 && !p.call.textbook) {
            shared.forward(p.q, key_of(p), value_of(p), p.options, reused);
            diff = result_difference(reused, p.expected);
          } else {
            diff = result_difference(run(shared, p), p.expected);
          }
          if (!diff.empty()) failures[t].push_back(where + diff);
        } catch (const std::exception& e) {
          failures[t].push_back(where + "threw " + e.what());
        }
        if (t == 0 && j % 7 == 6) shared.release_workspaces();
      }
    });
  }
  for (auto& th : threads) th.join();

  int total = 0;
  for (const auto& f : failures)
    for (const auto& msg : f) {
      ADD_FAILURE() << msg;
      ++total;
    }
  EXPECT_EQ(total, 0) << "of " << kThreads * kCallsPerThread << " concurrent calls differed from serial";
}

TEST(Concurrency, OneModuleManyThreadsMatchesSerial_Float32_E32_H4_T4x20) {
  check_threads_match_serial<float>(float_config(), kFloatCalls, 41);
}

TEST(Concurrency, OneModuleManyThreadsMatchesSerial_Float64_E24_H3_kdim16_vdim20_biaskv_zeroattn_T4x20) {
  check_threads_match_serial<double>(double_config(), kDoubleCalls, 42);
}

// The comparison above must see a one-ulp change anywhere, and a missing
// attn_weights: perturb the expected result and it must report it.
TEST(Concurrency, CheckerFailsWhenOneElementIsPerturbed) {
  std::mt19937_64 rng(43);
  const auto p = prepare<float>(kFloatCalls[0], float_config(), rng);
  const MultiheadAttention m(float_config(), 43);
  const ForwardResult<float> a = run(m, *p);
  ASSERT_EQ(result_difference(run(m, *p), a), "");
  ForwardResult<float> b = a;
  b.output[b.output.numel() / 2] = std::nextafter(b.output[b.output.numel() / 2], kInf);
  EXPECT_NE(result_difference(b, a).find("output index"), std::string::npos) << result_difference(b, a);
  b = a;
  (*b.attn_weights)[3] = std::nextafter((*b.attn_weights)[3], -kInf);
  EXPECT_NE(result_difference(b, a).find("attn_weights index 3"), std::string::npos);
  b.attn_weights.reset();
  EXPECT_NE(result_difference(b, a).find("absent"), std::string::npos);
}

// ---- thread count -----------------------------------------------------------------

// The fused forward at num_threads 1 and 2 gives the same bits: with
// need_weights = false (float32: the flash kernel; float64: materialized)
// and with need_weights = true (materialized, L·S = 23040 > 16384 so its
// OpenMP region runs). The projections (the linear layer's fixed blocks)
// and our loops change their team; BLAS runs each block on one thread.
struct ThreadCase {
  bool need_weights;
  bool causal;
  MaskKind mask;
  std::string name() const {
    static const char* kMasks[] = {"", "_mask2dbool", "_mask3dfloat"};
    return std::string(need_weights ? "weights" : "noweights") + (causal ? "_causal" : "") +
           kMasks[static_cast<int>(mask)] + "_B2_L160_S144_threads1vs2";
  }
};

const ThreadCase kThreadCases[] = {
    {false, false, MaskKind::None},
    {false, true, MaskKind::Float3d},
    {true, false, MaskKind::None},
    {true, true, MaskKind::Bool2d},
};

template <class T>
void check_thread_counts_agree(const ThreadCase& tc, const MultiheadAttentionConfig& cfg) {
  std::mt19937_64 rng(44);
  const BasicMultiheadAttention<T> m(cfg, 44);
  const Call call{2, 160, 144, true, tc.need_weights, false, tc.mask, true, tc.causal, false,
                  K::Auto, false, 1};
  auto p = prepare<T>(call, cfg, rng);
  const ForwardResult<T> one = run(m, *p);
  p->options.attention.num_threads = 2;
  const ForwardResult<T> two = run(m, *p);
  EXPECT_EQ(result_difference(two, one), "");
}

class ThreadCount : public ::testing::TestWithParam<ThreadCase> {};

TEST_P(ThreadCount, FusedForwardBitsIdentical_Float32) {
  check_thread_counts_agree<float>(GetParam(), float_config());
}
TEST_P(ThreadCount, FusedForwardBitsIdentical_Float64) {
  check_thread_counts_agree<double>(GetParam(), double_config());
}

INSTANTIATE_TEST_SUITE_P(Table, ThreadCount, ::testing::ValuesIn(kThreadCases),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace multihead
