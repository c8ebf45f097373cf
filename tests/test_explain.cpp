// tests/test_explain.cpp: the explain report (multihead/explain.hpp): where
// its weights come from, its rules, and its three writers.
//
// The weights are checked against softmax(q_h·k_hᵀ/√D) computed here in
// float64 plain loops from the module's parameters (no kernel, no BLAS), at
// 1e-12: both sides are float64 and do O(E) operations per score, so they
// agree to rounding, far below 1e-12 at these sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "explain/json_text.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using explain::LayerAttention;
using explain::Report;

// Per-head attention weights of self-attention over x (L, E), one batch
// entry, straight from the formula: q = x W_qᵀ + b_q (rows 0..E-1 of
// in_proj_weight), k likewise (rows E..2E-1), then per head h the softmax
// over j of q_h(i)·k_h(j) / √D.
std::vector<double> weights_by_formula(const MultiheadAttentionParameters<double>& p, const std::vector<double>& x,
                                       int64_t L, int64_t E, int64_t H) {
  const int64_t D = E / H;
  auto project = [&](int64_t block) {
    std::vector<double> y(static_cast<std::size_t>(L * E));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t o = 0; o < E; ++o) {
        double s = p.in_proj_bias[block * E + o];
        for (int64_t e = 0; e < E; ++e) s += x[static_cast<std::size_t>(i * E + e)] * p.in_proj_weight[(block * E + o) * E + e];
        y[static_cast<std::size_t>(i * E + o)] = s;
      }
    return y;
  };
  const std::vector<double> q = project(0), k = project(1);
  std::vector<double> w(static_cast<std::size_t>(H * L * L));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(static_cast<std::size_t>(L));
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j < L; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += q[static_cast<std::size_t>(i * E + h * D + d)] * k[static_cast<std::size_t>(j * E + h * D + d)];
        s[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(D));
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      for (double& v : s) z += (v = std::exp(v - m));
      for (int64_t j = 0; j < L; ++j) w[static_cast<std::size_t>((h * L + i) * L + j)] = s[static_cast<std::size_t>(j)] / z;
    }
  return w;
}

struct WeightsCase {
  int64_t E, H, L, B;  // B = 0: unbatched (L, E)
  int64_t entry;
  uint64_t seed;
};

class ExplainWeights : public ::testing::TestWithParam<WeightsCase> {};

TEST_P(ExplainWeights, PerHeadEqualFormulaInDouble) {
  const WeightsCase c = GetParam();
  MultiheadAttentionConfig config;
  config.embed_dim = c.E;
  config.num_heads = c.H;
  BasicMultiheadAttention<double> mha(config, c.seed);
  std::mt19937_64 rng(c.seed + 1);
  MultiheadAttentionParameters<double> p = mha.parameters();
  for (auto& b : p.in_proj_bias.vec()) b = std::normal_distribution<double>(0, 0.5)(rng);  // nonzero biases
  mha = BasicMultiheadAttention<double>(config, p);
  const Tensor<double> x = test::random_tensor<double>(c.B ? Shape{c.L, c.B, c.E} : Shape{c.L, c.E}, rng);

  const LayerAttention layer = explain::attention_weights_per_head(mha, x, c.entry);
  ASSERT_EQ(layer.heads, c.H);
  ASSERT_EQ(layer.queries, c.L);
  ASSERT_EQ(layer.keys, c.L);
  std::vector<double> entry(static_cast<std::size_t>(c.L * c.E));  // (L, E) of batch entry `entry`
  const int64_t B = c.B ? c.B : 1;
  for (int64_t i = 0; i < c.L; ++i)
    for (int64_t e = 0; e < c.E; ++e) entry[static_cast<std::size_t>(i * c.E + e)] = x[(i * B + c.entry) * c.E + e];
  const std::vector<double> want = weights_by_formula(p, entry, c.L, c.E, c.H);
  double worst = 0;
  for (std::size_t k = 0; k < want.size(); ++k) worst = std::max(worst, std::abs(layer.weights[k] - want[k]));
  EXPECT_LE(worst, 1e-12) << "worst |weight - formula| over " << want.size() << " weights";
}

INSTANTIATE_TEST_SUITE_P(Table, ExplainWeights,
                         ::testing::Values(WeightsCase{8, 2, 5, 0, 0, 1}, WeightsCase{12, 3, 7, 0, 0, 2},
                                           WeightsCase{8, 4, 4, 3, 2, 3}, WeightsCase{6, 1, 1, 0, 0, 4}),
                         [](const auto& info) {
                           const WeightsCase& c = info.param;
                           return "E" + std::to_string(c.E) + "_H" + std::to_string(c.H) + "_L" + std::to_string(c.L) +
                                  "_B" + std::to_string(c.B) + "_entry" + std::to_string(c.entry);
                         });

TEST(ExplainWeights, BatchEntryOutOfRangeNamed) {
  MultiheadAttentionConfig config;
  config.embed_dim = 4;
  config.num_heads = 2;
  const BasicMultiheadAttention<float> mha(config, 1);
  const Tensor<float> x({3, 2, 4}, 0.5f);  // (L, B, E), B = 2
  try {
    explain::attention_weights_per_head(mha, x, 2);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch: expected an entry 0 to 1 of the input's batch of 2, got 2"),
              std::string::npos)
        << e.what();
  }
}

// A report draws distributions: NaN or Inf in the input or the parameters,
// or a finite input whose scores overflow, is an Error naming the tensor.
TEST(ExplainWeights, NonFiniteInputsParametersAndOverflowNamed) {
  MultiheadAttentionConfig config;
  config.embed_dim = 4;
  config.num_heads = 2;
  const BasicMultiheadAttention<float> mha(config, 1);
  auto message = [&](const BasicMultiheadAttention<float>& m, const Tensor<float>& x) {
    try {
      explain::attention_weights_per_head(m, x, 0, "--input x.npy");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor<float> x({3, 4}, 0.25f);
  EXPECT_EQ(message(mha, x), "no error");
  x[1 * 4 + 2] = std::nanf("");
  EXPECT_NE(message(mha, x).find("--input x.npy: non-finite value nan at index (1, 2)"), std::string::npos)
      << message(mha, x);
  x[1 * 4 + 2] = 1e30f;  // finite; q·k overflows float32
  EXPECT_NE(message(mha, x).find("--input x.npy: head 0's attention weights at query 1 are not finite"),
            std::string::npos)
      << message(mha, x);
  x[1 * 4 + 2] = 0.25f;
  MultiheadAttentionParameters<float> p = mha.parameters();
  p.in_proj_weight[5] = std::numeric_limits<float>::infinity();
  const BasicMultiheadAttention<float> broken(config, p);
  EXPECT_NE(message(broken, x).find("in_proj_weight: non-finite value inf"), std::string::npos) << message(broken, x);
}

TEST(ExplainWeights, KeyLabelsFollowBiasKvThenZeroAttn) {
  MultiheadAttentionConfig config;
  config.embed_dim = 4;
  config.num_heads = 2;
  config.add_bias_kv = true;
  config.add_zero_attn = true;
  const BasicMultiheadAttention<float> mha(config, 1);
  const Tensor<float> x({3, 4}, 0.25f);
  const LayerAttention layer = explain::attention_weights_per_head(mha, x);
  const std::vector<std::string> keys = explain::key_labels(config, explain::position_labels(3));
  EXPECT_EQ(keys, (std::vector<std::string>{"0", "1", "2", "bias_k", "zero_attn"}));
  EXPECT_EQ(layer.keys, static_cast<int64_t>(keys.size()));
}

// A hand-made report: H = 2, L = S = 3; head 0's row 0 walks through every
// shade level (0.04, 0.06 + ..., see below).
Report small_report() {
  Report r;
  r.title = "t";
  r.source = "s";
  r.query_tokens = {"a", "bb", "c"};
  r.key_tokens = r.query_tokens;
  LayerAttention l;
  l.name = "layer 1";
  l.heads = 2;
  l.queries = 3;
  l.keys = 3;
  l.weights = {0.04, 0.16, 0.80,  0.2, 0.3, 0.5,  1.0, 0.0, 0.0,    // head 0
               0.50, 0.30, 0.20,  0.0, 1.0, 0.0,  0.1, 0.1, 0.8};  // head 1
  r.layers.push_back(l);
  return r;
}

TEST(ExplainReport, HeadAverageIsTheMeanOverHeads) {
  const std::vector<double> mean = explain::head_average(small_report().layers[0]);
  const std::vector<double> want = {0.27, 0.23, 0.50, 0.10, 0.65, 0.25, 0.55, 0.05, 0.40};
  ASSERT_EQ(mean.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(mean[k], want[k], 1e-15) << "element " << k;
}

struct BadReport {
  const char* name;
  void (*spoil)(Report&);
  const char* message;
};

class ExplainValidate : public ::testing::TestWithParam<BadReport> {};

TEST_P(ExplainValidate, NamesTheField) {
  Report r = small_report();
  GetParam().spoil(r);
  try {
    explain::validate(r);
    FAIL() << "expected an Error for " << GetParam().name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ExplainValidate,
    ::testing::Values(
        BadReport{"NoLayer", [](Report& r) { r.layers.clear(); }, "report.layers: expected at least one layer"},
        BadReport{"NoToken", [](Report& r) { r.query_tokens.clear(); },
                  "report: expected at least one query and one key token, got 0 and 3"},
        BadReport{"QueryTokens", [](Report& r) { r.query_tokens.pop_back(); },
                  "report.layers[0].queries: expected 2 (the query tokens), got 3"},
        BadReport{"KeyTokens", [](Report& r) { r.key_tokens.push_back("x"); },
                  "report.layers[0].keys: expected 4 (the key tokens), got 3"},
        BadReport{"WeightCount", [](Report& r) { r.layers[0].weights.pop_back(); },
                  "report.layers[0].weights: expected 18 values (H·L·S = 2·3·3), got 17"},
        BadReport{"WeightAboveOne", [](Report& r) { r.layers[0].weights[4] = 1.5; },
                  "report.layers[0].weights[0][1][1]: expected a probability in [0, 1], got 1.5"},
        BadReport{"WeightNaN", [](Report& r) { r.layers[0].weights[17] = NAN; },
                  "report.layers[0].weights[1][2][2]: expected a probability in [0, 1], got nan"},
        BadReport{"Focus", [](Report& r) { r.focus = 3; }, "report.focus: expected -1 (none) or a query token 0 to 2, got 3"},
        BadReport{"MeasureHeads", [](Report& r) { r.measures.push_back({"m", "d", 0, {0.1}, {}}); },
                  "report.measures[0] (m).per_head: expected 2 values (the layer's heads), got 1"},
        BadReport{"MeasurePicked", [](Report& r) { r.measures.push_back({"m", "d", 0, {0.1, 0.2}, 2}); },
                  "report.measures[0] (m).picked: expected a head 0 to 1, got 2"},
        BadReport{"MeasureLayer", [](Report& r) { r.measures.push_back({"m", "d", 1, {0.1, 0.2}, {}}); },
                  "report.measures[0] (m).layer: expected 0 to 0, got 1"},
        BadReport{"Confidence", [](Report& r) { r.answer = explain::Answer{"q", "a", 2.0}; },
                  "report.answer.confidence: expected a probability in [0, 1], got 2"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ExplainJson, NumbersAreShortestRoundTripOfTheirPrecision) {
  using explain::Precision;
  using explain::detail::json_number;
  EXPECT_EQ(json_number(static_cast<double>(0.1f), Precision::Float32), "0.1");
  EXPECT_EQ(json_number(0.1, Precision::Float64), "0.1");
  EXPECT_EQ(json_number(static_cast<double>(0.1f), Precision::Float64), "0.10000000149011612");
  EXPECT_EQ(json_number(1.0, Precision::Float32), "1");
  EXPECT_EQ(json_number(0.0, Precision::Float32), "0");
  const float f = 0.123456789f;
  EXPECT_EQ(std::stof(json_number(f, Precision::Float32)), f);
}

TEST(ExplainJson, StringsCannotCloseTheScriptElement) {
  using explain::detail::json_string;
  EXPECT_EQ(json_string("</script>&"), "\"\\u003c/script\\u003e\\u0026\"");
  EXPECT_EQ(json_string("a\"b\\\n"), "\"a\\\"b\\\\\\n\"");
  EXPECT_EQ(json_string("\xff"), "\"\xef\xbf\xbd\"");  // invalid UTF-8 -> U+FFFD
}

TEST(ExplainJson, ReportJsonCarriesEveryPart) {
  Report r = small_report();
  r.answer = explain::Answer{"What does \"it\" refer to?", "animal", 0.75};
  r.measures.push_back({"it → referent", "mass", 0, {0.25, 0.5}, 1});
  r.focus = 2;
  const nlohmann::json j = nlohmann::json::parse(explain::report_json(r));
  EXPECT_EQ(j["query_tokens"], nlohmann::json({"a", "bb", "c"}));
  EXPECT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["weights"][1][2][2].get<double>(), 0.8);  // [h][i][j]
  // Float32 precision: the shortest decimal that reads back as the float.
  EXPECT_EQ(j["layers"][0]["weights"][0][0][1].dump(), "0.16");
  EXPECT_EQ(static_cast<float>(j["layers"][0]["weights"][0][0][1].get<double>()), 0.16f);
  EXPECT_NEAR(j["layers"][0]["average"][0][0].get<double>(), 0.27, 1e-7);
  EXPECT_EQ(j["answer"]["answer"], "animal");
  EXPECT_EQ(j["answer"]["confidence"].get<double>(), 0.75);
  EXPECT_EQ(j["measures"][0]["picked"], 1);
  EXPECT_EQ(j["measures"][0]["per_head"][1].get<double>(), 0.5);
  EXPECT_EQ(j["focus"], 2);
}

TEST(ExplainBertviz, LayersOfOneByHByLByS) {
  Report r = small_report();
  r.layers.push_back(r.layers[0]);
  const nlohmann::json j = nlohmann::json::parse(explain::bertviz_json(r));
  ASSERT_EQ(j["attention"].size(), 2u);
  for (const auto& layer : j["attention"]) {
    ASSERT_EQ(layer.size(), 1u);      // batch
    ASSERT_EQ(layer[0].size(), 2u);   // H
    ASSERT_EQ(layer[0][0].size(), 3u);  // L
    ASSERT_EQ(layer[0][0][0].size(), 3u);  // S
  }
  EXPECT_EQ(static_cast<float>(j["attention"][1][0][1][2][2].get<double>()), 0.8f);
  EXPECT_FALSE(j.contains("key_tokens"));
  r.key_tokens = {"a", "bb", "zero_attn"};
  EXPECT_EQ(nlohmann::json::parse(explain::bertviz_json(r))["key_tokens"][2], "zero_attn");
}

TEST(ExplainHtml, OneSelfContainedPageWithTheData) {
  Report r = small_report();
  r.query_tokens = {"</script>", "@JS@", "c"};
  r.key_tokens = r.query_tokens;
  r.title = "<b>title</b>";
  const std::string page = explain::html_report(r);
  // Two </script>: the data element's and the script's; the tokens are escaped.
  std::size_t count = 0;
  for (std::size_t at = page.find("</script>"); at != std::string::npos; at = page.find("</script>", at + 1)) ++count;
  EXPECT_EQ(count, 2u);
  EXPECT_NE(page.find("<title>&lt;b&gt;title&lt;/b&gt;</title>"), std::string::npos);
  EXPECT_EQ(page.find("@CSS@"), std::string::npos);
  EXPECT_NE(page.find("\"@JS@\""), std::string::npos);  // the token, kept as data
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const std::size_t begin = page.find(open) + open.size();
  const nlohmann::json data = nlohmann::json::parse(page.substr(begin, page.find("</script>", begin) - begin));
  EXPECT_EQ(data["query_tokens"][0], "</script>");
  EXPECT_NE(page.find("default-src 'none'"), std::string::npos);
}

TEST(ExplainHtml, RefusesMoreThan128Tokens) {
  Report r;
  r.query_tokens = explain::position_labels(129);
  r.key_tokens = r.query_tokens;
  LayerAttention l;
  l.heads = 1;
  l.queries = l.keys = 129;
  l.weights.assign(129 * 129, 1.0 / 129);
  r.layers.push_back(l);
  try {
    explain::html_report(r);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 128 query and key tokens, got 129 and 129"), std::string::npos)
        << e.what();
  }
}

TEST(ExplainText, ShadesColoursAndTheStrongestKey) {
  const Report r = small_report();
  explain::TextOptions o;
  o.token = 0;
  const std::string ascii = explain::text_view(r, o);
  // Head 1, query "a": 0.04 (below 5%: blank), 0.16 (':'), 0.80 ('#'); strongest "c".
  EXPECT_NE(ascii.find("1           4  :  16  #  80   c\n"), std::string::npos) << ascii;
  // Head 2: 0.50 ('#' from 50%), 0.30 ('+' from 30%), 0.20 (':').
  EXPECT_NE(ascii.find("2       #  50  +  30  :  20   a\n"), std::string::npos) << ascii;
  EXPECT_NE(ascii.find("mean    :  27  :  23  #  50   c\n"), std::string::npos) << ascii;  // 0.5: from 50%
  o.unicode = true;
  const std::string unicode = explain::text_view(r, o);
  EXPECT_NE(unicode.find("2       \u2588  50  \u2593  30  \u2592  20   a\n"), std::string::npos) << unicode;
  o.colour = true;
  const std::string coloured = explain::text_view(r, o);
  EXPECT_NE(coloured.find("\x1b[33m2     \x1b[0m  \x1b[33m\u2588  50\x1b[0m"), std::string::npos) << coloured;
  o.token = 1;
  EXPECT_NE(explain::text_view(r, o).find("query token 1 \"bb\""), std::string::npos);
}

// A trained model's report adds the answer and the measures of the layer
// shown; ASCII mode writes the measure name's arrow as "->".
TEST(ExplainText, AnswerAndMeasuresOfTheShownLayer) {
  Report r = small_report();
  r.answer = explain::Answer{"What does \"it\" refer to?", "c", 0.875};
  explain::HeadMeasure m;
  m.name = "it \u2192 c";
  m.description = "how it was measured.";
  m.layer = 0;
  m.per_head = {0.125, 0.75};
  m.picked = 1;
  r.measures.push_back(m);
  explain::TextOptions o;
  const std::string ascii = explain::text_view(r, o);
  EXPECT_NE(ascii.find("\nanswer: What does \"it\" refer to? \"c\" (88%)\n"), std::string::npos) << ascii;
  EXPECT_NE(ascii.find("\nit -> c, per head:  1: 0.12  2: 0.75 <- picked\nhow it was measured.\n"), std::string::npos)
      << ascii;
  o.unicode = true;
  EXPECT_NE(explain::text_view(r, o).find("it \u2192 c, per head:"), std::string::npos);
  r.answer.reset();
  r.measures[0].layer = 1;  // another layer's measure is not shown with layer 0
  r.layers.push_back(r.layers[0]);
  o.unicode = false;
  const std::string without = explain::text_view(r, o);
  EXPECT_EQ(without.find("answer:"), std::string::npos) << without;
  EXPECT_EQ(without.find("per head:"), std::string::npos) << without;
}

TEST(ExplainText, TokenAndLayerOutOfRangeNamed) {
  explain::TextOptions o;
  o.token = 3;
  EXPECT_THROW(
      {
        try {
          explain::text_view(small_report(), o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("token: expected a query token 0 to 2, got 3"), std::string::npos);
          throw;
        }
      },
      Error);
  o.token = 0;
  o.layer = 1;
  EXPECT_THROW(explain::text_view(small_report(), o), Error);
}

}  // namespace
}  // namespace multihead
