// tests/test_narrow_weights.cpp: 16-bit checkpoints kept narrow
// (load_weights_narrow, multihead/weights.hpp).
//  - a BF16 (F16) file into a bfloat16 (float16) module and back out is
//    bit-identical, file bytes included;
//  - another dtype is rounded once: F32 to nearest even (to_bfloat16 /
//    to_float16 of the float), BF16 into float16 through its exact float;
//  - separate q/k/v projection weights, prefixes and mixed dtypes;
//  - the peak resident set of the load, in a child process, stays below
//    2.5x the file's size: the mapped file (1x) plus the parameters (1x);
//    a float32 copy would add 2x, the float64 of load_weights adds 4x, and
//    load_weights on the same file is checked to exceed the bound (so the
//    bound can fail).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/weights.hpp"

// Shadow memory and quarantines make a resident set mean something else.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MULTIHEAD_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define MULTIHEAD_UNDER_SANITIZER 1
#endif
#endif

namespace multihead {
namespace {

namespace fs = std::filesystem;

// A folder of its own, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/multihead-narrow-weights-XXXXXX";
    const char* made = mkdtemp(tmpl);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

MultiheadAttentionConfig config(int64_t E, int64_t H, int64_t kdim = 0) {
  MultiheadAttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  c.kdim = kdim;
  c.vdim = kdim;
  c.add_bias_kv = true;
  return c;
}

// A float32 module with every parameter random (biases too, so that no
// tensor is all zeros).
BasicMultiheadAttention<float> random_module(const MultiheadAttentionConfig& c, uint64_t seed) {
  BasicMultiheadAttention<float> m(c, seed);
  MultiheadAttentionParameters<float> p = m.parameters();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for_each_parameter(c, p, [&](const ParameterInfo&, Tensor<float>& t) {
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = normal(rng);
  });
  return BasicMultiheadAttention<float>(c, std::move(p));
}

template <class E>
uint16_t bits_of(E e) {
  return e.bits;
}

template <class E>
void expect_parameters_equal(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<E>& got,
                             const MultiheadAttentionParameters<E>& want) {
  for_each_parameter(c, got, want, [&](const ParameterInfo& info, const Tensor<E>& g, const Tensor<E>& w) {
    ASSERT_EQ(g.shape(), w.shape()) << info.name;
    for (int64_t i = 0; i < g.numel(); ++i)
      ASSERT_EQ(bits_of(g[i]), bits_of(w[i])) << info.name << "[" << i << "]";
  });
}

template <class E>
void check_round_trip(int64_t kdim) {
  const MultiheadAttentionConfig c = config(16, 4, kdim);
  const NarrowMultiheadAttention<E> original =
      NarrowMultiheadAttention<E>::rounded(c, random_module(c, 3).parameters());
  const std::string bytes = serialize_weights(original);
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_file_atomic(path, bytes);
  BasicLoadedWeights<E> w = load_weights_narrow<E>(path);
  EXPECT_EQ(w.parameter_dtype, std::optional<DType>(compute_dtype_of<E>() == ComputeDtype::BF16 ? DType::BF16
                                                                                               : DType::F16));
  expect_parameters_equal(c, w.parameters, original.parameters());
  const NarrowMultiheadAttention<E> loaded(w.config, std::move(w.parameters));
  EXPECT_EQ(serialize_weights(loaded), bytes) << "saved back, the file's bytes are the same";
}

TEST(NarrowWeights, Bf16FileIntoBf16ModuleAndBackIsBitIdentical_packed) { check_round_trip<bfloat16>(0); }
TEST(NarrowWeights, Bf16FileIntoBf16ModuleAndBackIsBitIdentical_separate_kdim8) { check_round_trip<bfloat16>(8); }
TEST(NarrowWeights, F16FileIntoF16ModuleAndBackIsBitIdentical_packed) { check_round_trip<float16>(0); }
TEST(NarrowWeights, F16FileIntoF16ModuleAndBackIsBitIdentical_separate_kdim8) { check_round_trip<float16>(8); }

// An F32 file into a 16-bit module: each value rounded once, to nearest
// even (what .to(torch.bfloat16) / .half() do), and parameter_dtype says F32.
template <class E>
void check_f32_rounded_once() {
  const MultiheadAttentionConfig c = config(8, 2);
  const BasicMultiheadAttention<float> m = random_module(c, 5);
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  save_weights(path, m);
  const BasicLoadedWeights<E> w = load_weights_narrow<E>(path);
  EXPECT_EQ(w.parameter_dtype, std::optional<DType>(DType::F32));
  expect_parameters_equal(c, w.parameters, NarrowMultiheadAttention<E>::rounded(c, m.parameters()).parameters());
}
TEST(NarrowWeights, F32FileIntoBf16ModuleRoundsOnce) { check_f32_rounded_once<bfloat16>(); }
TEST(NarrowWeights, F32FileIntoF16ModuleRoundsOnce) { check_f32_rounded_once<float16>(); }

// BF16 into float16: the bf16 value (exact in float) rounded once to f16.
TEST(NarrowWeights, Bf16FileIntoF16ModuleRoundsItsExactValueOnce) {
  const MultiheadAttentionConfig c = config(8, 2);
  const NarrowMultiheadAttention<bfloat16> b =
      NarrowMultiheadAttention<bfloat16>::rounded(c, random_module(c, 9).parameters());
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_file_atomic(path, serialize_weights(b));
  const BasicLoadedWeights<float16> w = load_weights_narrow<float16>(path);
  EXPECT_EQ(w.parameter_dtype, std::optional<DType>(DType::BF16));
  MultiheadAttentionParameters<float16> want;
  for_each_parameter(c, b.parameters(), want,
                     [&](const ParameterInfo& info, const Tensor<bfloat16>& from, Tensor<float16>& to) {
                       if (info.present) to = round_to<float16>(widen<float>(from));
                     });
  expect_parameters_equal(c, w.parameters, want);
}

// The same rules as load_weights: a prefix picks the module, metadata
// gives the configuration, and the values agree with load_weights' exact
// doubles.
TEST(NarrowWeights, PrefixAndConfigurationAsLoadWeights) {
  const MultiheadAttentionConfig c = config(8, 2);
  const NarrowMultiheadAttention<bfloat16> b =
      NarrowMultiheadAttention<bfloat16>::rounded(c, random_module(c, 11).parameters());
  std::map<std::string, Tensor<bfloat16>> tensors;
  for (const auto& [name, t] : b.state_dict()) tensors.emplace("enc.attn." + name, t);
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_file_atomic(path, serialize_safetensors_narrow(tensors, {{"enc.attn.num_heads", "2"}}));
  LoadOptions o;
  o.prefix = "enc.attn";
  const BasicLoadedWeights<bfloat16> w = load_weights_narrow<bfloat16>(path, o);
  const LoadedWeights d = load_weights(path, o);
  EXPECT_EQ(w.prefix, "enc.attn.");
  EXPECT_EQ(w.config.num_heads, 2);
  EXPECT_TRUE(w.config.add_bias_kv);
  expect_parameters_equal(c, w.parameters, b.parameters());
  for_each_parameter(c, w.parameters, d.parameters, [&](const ParameterInfo& info, const Tensor<bfloat16>& n,
                                                        const Tensor<double>& e) {
    for (int64_t i = 0; i < n.numel(); ++i) ASSERT_EQ(double{to_float(n[i])}, e[i]) << info.name;
  });
  o.prefix = "dec";
  EXPECT_THROW(load_weights_narrow<bfloat16>(path, o), Error);
}

// ---- peak memory ----------------------------------------------------------

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS"), or -1.
long long status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // "  1234 kB"
  return -1;
}

// The growth of the peak resident set while `load` runs, measured in a
// child process (so the test's own allocations do not count) after the
// peak was reset to the current set (writing 5 to /proc/self/clear_refs,
// Linux >= 4.0). -1 when it cannot be measured.
template <class Load>
long long peak_growth_in_child(const Load& load) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    long long growth = -1;
    {
      std::ofstream clear("/proc/self/clear_refs");
      clear << "5";
    }
    const long long before = status_bytes("VmRSS");
    try {
      load();
      const long long peak = status_bytes("VmHWM");
      if (before >= 0 && peak >= 0) growth = peak - before;
    } catch (...) {
    }
    (void)!write(fds[1], &growth, sizeof growth);
    _exit(0);
  }
  close(fds[1]);
  long long growth = -1;
  if (pid < 0 || read(fds[0], &growth, sizeof growth) != sizeof growth) growth = -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return growth;
}

TEST(NarrowWeights, Bf16LoadHoldsNoWideCopy_E2048) {
#ifdef MULTIHEAD_UNDER_SANITIZER
  GTEST_SKIP() << "a resident set under a sanitizer includes its shadow memory";
#endif
  // E = 2048: 4·E² + 4·E bf16 parameters, a 32 MiB file; the float64 copy
  // of load_weights would be 128 MiB.
  const int64_t E = 2048;
  MultiheadAttentionConfig c;
  c.embed_dim = E;
  c.num_heads = 16;
  MultiheadAttentionParameters<bfloat16> p;
  uint64_t s = 1;
  auto fill = [&](Shape shape) {
    Tensor<bfloat16> t(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t[i] = to_bfloat16(static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1.0p-31f);
    }
    return t;
  };
  p.in_proj_weight = fill({3 * E, E});
  p.in_proj_bias = fill({3 * E});
  p.out_proj_weight = fill({E, E});
  p.out_proj_bias = fill({E});
  const TempDir dir;
  const std::string path = dir.file("big.safetensors");
  write_file_atomic(path, serialize_weights(NarrowMultiheadAttention<bfloat16>(c, std::move(p))));
  const auto file_bytes = static_cast<long long>(fs::file_size(path));

  const long long narrow = peak_growth_in_child([&] {
    const BasicLoadedWeights<bfloat16> w = load_weights_narrow<bfloat16>(path);
    if (w.parameters.in_proj_weight.numel() != 3 * E * E) throw std::runtime_error("wrong shape");
  });
  const long long wide = peak_growth_in_child([&] {
    const LoadedWeights w = load_weights(path);
    if (w.parameters.in_proj_weight.numel() != 3 * E * E) throw std::runtime_error("wrong shape");
  });
  if (narrow < 0 || wide < 0) GTEST_SKIP() << "no /proc/self/status VmHWM or clear_refs here";
  const double bound = 2.5 * static_cast<double>(file_bytes);
  std::printf("file %.1f MiB; peak growth: load_weights_narrow %.1f MiB, load_weights %.1f MiB; bound %.1f MiB\n",
              file_bytes / 1048576.0, narrow / 1048576.0, wide / 1048576.0, bound / 1048576.0);
  EXPECT_LE(static_cast<double>(narrow), bound) << "the narrow load holds more than the map and the parameters";
  EXPECT_GT(static_cast<double>(wide), bound) << "the bound cannot tell a wide copy (float64) from none";
}

// ---- the grouped-query loader (load_gqa_weights_narrow) ------------------

GroupedQueryAttentionConfig gqa_config(bool bias) {
  GroupedQueryAttentionConfig c;
  c.embed_dim = 16;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.bias = bias;
  return c;
}

// Every parameter of two 16-bit modules, bit for bit.
template <class E>
void expect_same_bits(const NarrowGroupedQueryAttention<E>& got, const NarrowGroupedQueryAttention<E>& want) {
  const auto g = got.state_dict(), w = want.state_dict();
  ASSERT_EQ(g.size(), w.size());
  for (const auto& [name, t] : w) {
    ASSERT_TRUE(g.count(name)) << name;
    ASSERT_EQ(g.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(g.at(name).data(), t.data(), static_cast<std::size_t>(t.numel()) * sizeof(E)), 0) << name;
  }
}

// A file of the module's own dtype is taken bit for bit; an F32 file is
// rounded once, as NarrowGroupedQueryAttention::rounded rounds the float32
// module load_gqa_weights gives; the configuration is load_gqa_weights'.
template <class E>
void check_gqa_narrow(bool bias) {
  const GroupedQueryAttention<float> m(gqa_config(bias), 3);
  const NarrowGroupedQueryAttention<E> narrow = NarrowGroupedQueryAttention<E>::rounded(m.config(), m.parameters());
  const TempDir dir;
  const std::string own = dir.file("own.safetensors"), f32 = dir.file("f32.safetensors");
  write_file_atomic(own, serialize_gqa_weights(narrow));
  save_gqa_weights(f32, m);
  const NarrowLoadedGqaWeights<E> a = load_gqa_weights_narrow<E>(own);
  EXPECT_EQ(a.parameter_dtype, std::optional<DType>(std::is_same_v<E, bfloat16> ? DType::BF16 : DType::F16));
  EXPECT_EQ(a.config.num_kv_heads, 2);
  EXPECT_EQ(a.config.bias, bias);
  expect_same_bits(a.module(), narrow);
  const NarrowLoadedGqaWeights<E> b = load_gqa_weights_narrow<E>(f32);
  EXPECT_EQ(b.parameter_dtype, std::optional<DType>(DType::F32));
  const LoadedGqaWeights wide = load_gqa_weights(f32);
  EXPECT_EQ(b.config.embed_dim, wide.config.embed_dim);
  EXPECT_EQ(b.config.resolved_head_dim(), wide.config.resolved_head_dim());
  const GroupedQueryAttention<float> wide_module = wide.module<float>();
  expect_same_bits(b.module(), NarrowGroupedQueryAttention<E>::rounded(wide_module.config(), wide_module.parameters()));
}
TEST(NarrowGqaWeights, OwnDtypeBitForBitAndF32RoundedOnce_Bf16) { check_gqa_narrow<bfloat16>(false); }
TEST(NarrowGqaWeights, OwnDtypeBitForBitAndF32RoundedOnce_F16Bias) { check_gqa_narrow<float16>(true); }

// An F32 value float16 cannot hold is refused, naming the tensor and file.
TEST(NarrowGqaWeights, F16RefusesAValueBeyondItsRange) {
  GroupedQueryAttention<float> m(gqa_config(false), 3);
  GroupedQueryAttentionParameters<float> p = m.parameters();
  const TempDir dir;
  const std::string path = dir.file("big.safetensors");
  for_each_parameter(m.config(), p, [&](const ParameterInfo& info, Tensor<float>& t) {
    if (std::string(info.name) == "v_proj.weight") t[5] = 1e6f;
  });
  save_gqa_weights(path, GroupedQueryAttention<float>(m.config(), p));
  try {
    (void)load_gqa_weights_narrow<float16>(path);
    ADD_FAILURE() << "a value beyond float16's range was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("v_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_NO_THROW((void)load_gqa_weights_narrow<bfloat16>(path));
}

}  // namespace
}  // namespace multihead
