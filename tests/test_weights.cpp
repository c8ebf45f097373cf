// tests/test_weights.cpp: load_weights on whole models' state_dicts
// (LoadOptions::prefix, prefixed metadata, what was assumed) and
// find_attention_modules. The same files through the CLI, written by
// PyTorch itself, are tests/cli/checkpoints.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/weights.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using Tensors = std::map<std::string, Tensor<float>>;

using IntegerTensors = std::map<std::string, Shape>;  // name -> shape, written as I64 zeros

// Our writer's bytes with I64 tensors appended after its data, as a PyTorch
// export holding integer buffers lays them out. The header is re-padded to
// 8 bytes, as the writer pads it.
std::string with_int64_tensors(const std::string& bytes, const IntegerTensors& ints) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  std::string buffer = bytes.substr(8 + n);
  for (const auto& [name, shape] : ints) {
    const uint64_t begin = buffer.size(), size = 8 * static_cast<uint64_t>(shape_numel(shape));
    header[name] = {{"dtype", "I64"}, {"shape", shape}, {"data_offsets", {begin, begin + size}}};
    buffer.append(size, '\0');
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  return out + text + buffer;
}

// A safetensors file in a fresh folder, removed afterwards.
class WeightsFile {
 public:
  WeightsFile(const Tensors& tensors, const std::map<std::string, std::string>& metadata,
              const IntegerTensors& ints = {}) {
    std::string pattern = (fs::temp_directory_path() / "multihead-weights-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    path_ = dir_ + "/w.safetensors";
    write_file_atomic(path_, with_int64_tensors(serialize_safetensors(tensors, metadata), ints));
  }
  ~WeightsFile() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// One module's state_dict (bias on, packed or separate projections) under `prefix`.
void add_module(Tensors& t, const std::string& prefix, int64_t E, int64_t kdim, std::mt19937_64& rng) {
  auto r = [&](const Shape& s) { return test::random_tensor<float>(s, rng); };
  if (kdim == E) {
    t.emplace(prefix + "in_proj_weight", r({3 * E, E}));
  } else {
    t.emplace(prefix + "q_proj_weight", r({E, E}));
    t.emplace(prefix + "k_proj_weight", r({E, kdim}));
    t.emplace(prefix + "v_proj_weight", r({E, kdim}));
  }
  t.emplace(prefix + "in_proj_bias", r({3 * E}));
  t.emplace(prefix + "out_proj.weight", r({E, E}));
  t.emplace(prefix + "out_proj.bias", r({E}));
}

// An encoder of two layers with a feed-forward Linear beside each attention.
Tensors two_layer_model() {
  std::mt19937_64 rng(7);
  Tensors t;
  add_module(t, "enc.layers.0.self_attn.", 8, 8, rng);
  add_module(t, "enc.layers.1.self_attn.", 6, 4, rng);
  t.emplace("enc.layers.0.linear1.weight", test::random_tensor<float>({16, 8}, rng));
  return t;
}

TEST(LoadWeights, PrefixPicksOneModuleAndIgnoresTheRest) {
  const Tensors model = two_layer_model();
  const WeightsFile f(model, {{"num_heads", "2"}, {"enc.layers.1.self_attn.num_heads", "3"}});
  LoadOptions o;
  o.prefix = "enc.layers.1.self_attn";  // the final '.' is added
  const LoadedWeights w = load_weights(f.path(), o);
  EXPECT_EQ(w.prefix, "enc.layers.1.self_attn.");
  EXPECT_EQ(w.config.embed_dim, 6);
  EXPECT_EQ(w.config.kdim, 4);
  EXPECT_EQ(w.config.num_heads, 3) << "the prefixed key wins over the bare one";
  EXPECT_EQ(w.parameters.k_proj_weight[5], model.at("enc.layers.1.self_attn.k_proj_weight")[5]);

  o.prefix = "enc.layers.0.self_attn.";
  EXPECT_EQ(load_weights(f.path(), o).config.num_heads, 2) << "the bare key holds for every module";
}

TEST(LoadWeights, ErrorsListThePrefixesThatWouldWork) {
  const WeightsFile f(two_layer_model(), {{"num_heads", "2"}});
  const std::string modules = "; this file holds MultiheadAttention modules at prefixes enc.layers.0.self_attn., "
                              "enc.layers.1.self_attn. (pass one as prefix=)";
  EXPECT_EQ(error_of([&] { load_weights(f.path()); }),
            "enc.layers.0.linear1.weight: unexpected tensor in a MultiheadAttention state_dict (expected names: "
            "in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v, "
            "out_proj.weight, out_proj.bias) (in '" + f.path() + "')" + modules)
      << "without a prefix, the whole file must be one module";
  LoadOptions o;
  o.prefix = "dec.";
  EXPECT_EQ(error_of([&] { load_weights(f.path(), o); }),
            "prefix: expected the start of a tensor name (in '" + f.path() + "'), got 'dec.'" + modules);
  o.prefix = "enc.layers.0.";
  const std::string msg = error_of([&] { load_weights(f.path(), o); });
  EXPECT_EQ(msg.rfind("enc.layers.0.linear1.weight: unexpected tensor", 0), 0u) << msg;
}

// "a." and "a.b." are both modules (inspect lists both): each prefix loads
// its own module, and "a."'s tensors do not include "a.b."'s. Modules
// "layer.1." and "layer.11." share the start of their names, not a prefix.
TEST(LoadWeights, NestedModulesAndSimilarPrefixesEachLoadTheirOwn) {
  std::mt19937_64 rng(11);
  Tensors t;
  add_module(t, "layer.1.", 8, 8, rng);
  add_module(t, "layer.1.sub.", 6, 4, rng);
  add_module(t, "layer.11.", 4, 4, rng);
  const WeightsFile f(t, {{"num_heads", "2"}});
  const std::vector<FoundModule> found = find_attention_modules(f.path());
  ASSERT_EQ(found.size(), 3u);
  for (const FoundModule& m : found) {
    EXPECT_EQ(m.problem, "") << m.prefix;
    LoadOptions o;
    o.prefix = m.prefix;
    const std::string msg = error_of([&] {
      const LoadedWeights w = load_weights(f.path(), o);
      EXPECT_EQ(w.config.embed_dim, m.embed_dim) << m.prefix;
      EXPECT_EQ(w.config.key_dim(), m.kdim) << m.prefix;
      EXPECT_EQ(w.parameters.out_proj_bias[1], t.at(m.prefix + "out_proj.bias")[1]) << m.prefix;
    });
    EXPECT_EQ(msg, "") << "--prefix " << m.prefix << " is listed by inspect";
  }
  LoadOptions o;
  o.prefix = "layer.";
  EXPECT_EQ(error_of([&] { load_weights(f.path(), o); }).rfind("layer.1.in_proj_bias: unexpected tensor", 0), 0u)
      << "no module at layer.: its tensors stay unexpected";
}

// ---- integer tensors: a whole model's buffers ------------------------------------

const std::string kExpectedNames =
    "(expected names: in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, "
    "bias_k, bias_v, out_proj.weight, out_proj.bias)";

TEST(LoadWeights, IntegerBuffersOutsideThePrefixAreIgnored) {
  const Tensors model = two_layer_model();
  const WeightsFile f(model, {{"num_heads", "2"}},
                      {{"enc.layers.0.norm1.num_batches_tracked", {}}, {"embeddings.position_ids", {1, 512}}});
  LoadOptions o;
  o.prefix = "enc.layers.0.self_attn.";
  const LoadedWeights w = load_weights(f.path(), o);
  EXPECT_EQ(w.config.embed_dim, 8);
  EXPECT_EQ(w.parameters.in_proj_weight[3], model.at("enc.layers.0.self_attn.in_proj_weight")[3]);
  const std::vector<FoundModule> m = find_attention_modules(f.path());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].problem, "");
  EXPECT_EQ(m[1].problem, "");
}

TEST(LoadWeights, IntegerBufferWithoutPrefixIsAnUnexpectedTensor) {
  std::mt19937_64 rng(3);
  Tensors t;
  add_module(t, "enc.self_attn.", 4, 4, rng);
  const WeightsFile f(t, {{"num_heads", "2"}}, {{"bn.num_batches_tracked", {}}});
  EXPECT_EQ(error_of([&] { load_weights(f.path()); }),
            "bn.num_batches_tracked: unexpected tensor in a MultiheadAttention state_dict " + kExpectedNames +
                " (in '" + f.path() + "'); this file holds MultiheadAttention modules at prefixes enc.self_attn. "
                "(pass one as prefix=)");
}

TEST(LoadWeights, IntegerTensorUnderAParameterNameIsAnError) {
  std::mt19937_64 rng(5);
  Tensors t;
  add_module(t, "enc.self_attn.", 4, 4, rng);
  t.erase("enc.self_attn.in_proj_weight");
  const WeightsFile f(t, {{"num_heads", "2"}}, {{"enc.self_attn.in_proj_weight", {12, 4}}});
  const std::string want = "enc.self_attn.in_proj_weight: expected dtype float16, bfloat16, float32 or float64, "
                           "got int64 (in '" + f.path() + "')";
  LoadOptions o;
  o.prefix = "enc.self_attn.";
  EXPECT_EQ(error_of([&] { load_weights(f.path(), o); }), want);
  const std::vector<FoundModule> m = find_attention_modules(f.path());
  ASSERT_EQ(m.size(), 1u) << "the module is still found, and shown with its problem";
  EXPECT_EQ(m[0].prefix, "enc.self_attn.");
  EXPECT_EQ(m[0].problem, want);
}

TEST(LoadWeights, ReportsWhatItAssumed) {
  std::mt19937_64 rng(1);
  Tensors t;
  add_module(t, "", 4, 4, rng);
  const WeightsFile f(t, {{"num_heads", "2"}, {"dropout", "0.25"}});
  LoadOptions o;
  const LoadedWeights w = load_weights(f.path(), o);
  ASSERT_EQ(w.assumed.size(), 2u);
  EXPECT_EQ(w.assumed[0].key + "=" + w.assumed[0].value, "batch_first=false");
  EXPECT_EQ(w.assumed[1].key + "=" + w.assumed[1].value, "add_zero_attn=false");
  EXPECT_EQ(w.config.dropout, 0.25);
  o.overrides.batch_first = true;
  o.overrides.add_zero_attn = false;
  const LoadedWeights given = load_weights(f.path(), o);
  EXPECT_TRUE(given.assumed.empty());
  EXPECT_TRUE(given.config.batch_first);
}

TEST(FindAttentionModules, SizesFromTensorsAndTheRestFromMetadata) {
  const WeightsFile f(two_layer_model(), {{"enc.layers.0.self_attn.num_heads", "4"},
                                          {"enc.layers.0.self_attn.batch_first", "true"},
                                          {"enc.layers.1.self_attn.num_heads", "x"}});
  const std::vector<FoundModule> m = find_attention_modules(f.path());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].prefix, "enc.layers.0.self_attn.");
  EXPECT_EQ(m[0].embed_dim, 8);
  EXPECT_EQ(m[0].num_heads, 4);
  EXPECT_EQ(m[0].batch_first, true);
  EXPECT_FALSE(m[0].add_zero_attn.has_value());
  EXPECT_EQ(m[0].problem, "");
  EXPECT_EQ(m[1].prefix, "enc.layers.1.self_attn.");
  EXPECT_EQ(m[1].embed_dim, 6);
  EXPECT_EQ(m[1].kdim, 4);
  EXPECT_EQ(m[1].problem,
            "__metadata__.enc.layers.1.self_attn.num_heads: expected an integer, got 'x' (in '" + f.path() + "')");
}

// ---- grouped-query attention weights ---------------------------------------------

// E 8, H 4, Hkv 2, D 2: what `multihead init --num-kv-heads 2` writes.
GroupedQueryAttention<float> small_gqa(bool bias) {
  GroupedQueryAttentionConfig c;
  c.embed_dim = 8, c.num_heads = 4, c.num_kv_heads = 2, c.bias = bias;
  return GroupedQueryAttention<float>(c, 3);
}

// The K/V head count comes from the option, else the metadata, else
// k_proj.weight's rows over D (issue 22, defect 6: decode used num_heads).
TEST(GqaWeights, KvHeadsFromTheOptionTheMetadataOrTheShapes) {
  const GroupedQueryAttention<float> m = small_gqa(true);
  const WeightsFile with_meta(m.state_dict(), gqa_config_metadata(m));
  std::map<std::string, std::string> heads_only = {{"num_heads", "4"}};
  const WeightsFile shapes_only(m.state_dict(), heads_only);
  for (const WeightsFile* f : {&with_meta, &shapes_only}) {
    const LoadedGqaWeights w = load_gqa_weights(f->path());
    EXPECT_EQ(w.config.num_heads, 4);
    EXPECT_EQ(w.config.num_kv_heads, 2) << f->path();
    EXPECT_EQ(w.config.head_dim, 2);
    EXPECT_TRUE(w.config.bias);
    const auto got = w.module<float>().state_dict(), want = m.state_dict();
    for (const auto& [name, t] : want) EXPECT_EQ(got.at(name).vec(), t.vec()) << name;
  }
  GqaLoadOptions o;
  o.num_kv_heads = 4;  // the option wins, and is checked against the shapes
  EXPECT_EQ(error_of([&] { (void)load_gqa_weights(with_meta.path(), o); }),
            "num_kv_heads: 4 K/V heads of width 2 need k_proj.weight (8, 8), the file's is (4, 8) (in '" +
                with_meta.path() + "')");
}

TEST(GqaWeights, MetadataByTheOneRule) {
  const GroupedQueryAttention<float> m = small_gqa(false);
  struct Case {
    std::map<std::string, std::string> metadata;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"num_heads", "4x"}}, "__metadata__.num_heads: expected an integer, got '4x'"},
      {{{"num_heads", "0"}}, "__metadata__.num_heads: expected an integer in [1, 9223372036854775807], got '0'"},
      {{{"num_heads", "4"}, {"num_kv_heads", " 2"}}, "__metadata__.num_kv_heads: expected an integer, got ' 2'"},
      {{{"num_heads", "4"}, {"num_kv_heads", "3"}},
       "__metadata__.num_kv_heads: expected a divisor of num_heads 4 (each K/V head serves num_heads / num_kv_heads "
       "query heads), got 3"},
      {{{"num_heads", "4"}, {"head_dim", "4"}},
       "__metadata__.num_heads: 4 heads give head_dim 2 (q_proj.weight's 8 rows / 4), but __metadata__.head_dim says 4"},
      {{}, "num_heads: expected a head count, given (num_heads=) or in the weights' __metadata__ (as 'num_heads'), got "
           "neither"},
  };
  for (const Case& c : cases) {
    const WeightsFile f(m.state_dict(), c.metadata);
    EXPECT_EQ(error_of([&] { (void)load_gqa_weights(f.path()); }), c.message + " (in '" + f.path() + "')");
  }
}

// The MultiheadAttention loader names a grouped-query file and its flag.
TEST(GqaWeights, MhaLoaderNamesAGqaFile) {
  const GroupedQueryAttention<float> m = small_gqa(true);
  const WeightsFile f(m.state_dict(), gqa_config_metadata(m));
  EXPECT_EQ(error_of([&] { (void)load_weights(f.path()); }),
            "q_proj.weight: a grouped-query attention module (q_proj/k_proj/v_proj/o_proj.weight), not a "
            "MultiheadAttention state_dict; read it with load_gqa_weights, or on the command line with multihead "
            "forward or decode and --num-kv-heads 2 (the file's num_kv_heads) (in '" + f.path() + "')");
}

}  // namespace
}  // namespace multihead
