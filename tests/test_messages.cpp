// tests/test_messages.cpp: quoted input in error messages is cut, with its
// length (multihead/error.hpp: shortened, quote_input; issue 22: a
// 100,000-character word made a 100,178-byte "one-line" error).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/switches.hpp"
#include "io/message.hpp"
#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "multihead/train.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::error_of;

TEST(QuotedInput, ShortTextIsWhole) {
  EXPECT_EQ(quote_input("abc"), "'abc'");
  EXPECT_EQ(quote_input(std::string(kQuoteLimit, 'x')), "'" + std::string(kQuoteLimit, 'x') + "'");
  EXPECT_EQ(shortened(""), "");
}

// A quote inside the value that could be read as the closing one is
// escaped, so the quotes around it delimit it; one inside a word stays;
// shortened() (no quotes around) keeps it, and a cut never splits the escape.
TEST(QuotedInput, AQuoteThatCouldCloseIsEscaped) {
  EXPECT_EQ(quote_input("didn't"), "'didn't'");
  EXPECT_EQ(quote_input("a' b"), "'a\\x27 b'");
  EXPECT_EQ(quote_input("'"), "'\\x27'");
  EXPECT_EQ(quote_input("x'_y 'z'"), "'x'_y 'z\\x27'");
  EXPECT_EQ(shortened("a' b"), "a' b");
  EXPECT_EQ(quote_input("ab'", 4), "'ab...' (3 bytes)");
}

// Every run-time switch (src/core/switches.hpp) reads its value by one rule:
// "" or unset is the first name, a name its index, anything else one line
// naming the switch, every name and the value, quoted and escaped (an
// environment value may hold a newline or a terminal escape).
TEST(Switches, OneRuleForEveryName) {
  using detail::env_switch;
  using detail::switch_choice;
  EXPECT_EQ(switch_choice("s", "", {"auto", "flash", "matmul"}), 0u);
  EXPECT_EQ(switch_choice("s", "auto", {"auto", "flash", "matmul"}), 0u);
  EXPECT_EQ(switch_choice("s", "matmul", {"auto", "flash", "matmul"}), 2u);
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Value);
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message([] { (void)switch_choice("s", "Auto", {"auto", "flash"}); }),
            "s: expected one of auto, flash; got 'Auto'");
  EXPECT_EQ(message([] { (void)switch_choice("s", "a\nb' \x1b[2J", {"auto", "plain"}); }),
            "s: expected one of auto, plain; got 'a\\x0ab\\x27 \\x1b[2J'");
  const char* var = "MULTIHEAD_TEST_SWITCH";
  unsetenv(var);
  EXPECT_EQ(env_switch(var, {"auto", "views"}), 0u);
  setenv(var, "views", 1);
  EXPECT_EQ(env_switch(var, {"auto", "views"}), 1u);
  setenv(var, "copy\n", 1);
  EXPECT_EQ(message([&] { (void)env_switch(var, {"auto", "views"}); }),
            "MULTIHEAD_TEST_SWITCH: expected one of auto, views; got 'copy\\x0a'");
  unsetenv(var);
}

TEST(QuotedInput, LongTextShowsItsStartAndLength) {
  const std::string word(100000, 'w');
  EXPECT_EQ(quote_input(word), "'" + std::string(kQuoteLimit, 'w') + "...' (100000 bytes)");
  EXPECT_EQ(shortened(word, 4), "wwww... (100000 bytes)");
  // One byte over the limit is cut too.
  EXPECT_EQ(shortened(std::string(kQuoteLimit + 1, 'a')),
            std::string(kQuoteLimit, 'a') + "... (" + std::to_string(kQuoteLimit + 1) + " bytes)");
}

// The cut never splits a UTF-8 character: "é" is 2 bytes, so a cut at 3
// bytes of "aéé" keeps "aé", and at 2 keeps "a".
TEST(QuotedInput, CutsOnACharacterBoundary) {
  EXPECT_EQ(shortened("a\xc3\xa9\xc3\xa9", 3), "a\xc3\xa9... (5 bytes)");
  EXPECT_EQ(shortened("a\xc3\xa9\xc3\xa9", 2), "a... (5 bytes)");
}

// printable (names read from a file) cuts the same way and escapes control
// bytes; an Error's message is one line whatever it quotes.
TEST(QuotedInput, PrintableAndErrorAgree) {
  EXPECT_EQ(detail::printable(std::string(200, 'n') + "\n", 120), std::string(120, 'n') + "... (201 bytes)");
  EXPECT_EQ(detail::printable("a\nb"), "a\\x0ab");
  const Error e(Error::Kind::Value, "task: got " + quote_input(std::string(100000, 'z') + "\n"));
  EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
  EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
}

// A message is valid UTF-8 whatever it quotes (Python turns an invalid one
// into an empty ValueError): well-formed characters of every length are
// kept, every other byte is written as \xNN.
TEST(QuotedInput, BytesOutsideUtf8AreEscaped) {
  // Kept: ASCII, é (2 bytes), 日 (3), U+10FFFF and 😀 (4).
  const std::string good = "a\xc3\xa9\xe6\x97\xa5\xf4\x8f\xbf\xbf\xf0\x9f\x98\x80";
  EXPECT_EQ(escape_control_bytes(good), good);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"out_proj.\xff\xfe", "out_proj.\\xff\\xfe"},  // never in UTF-8
      {"\x80x", "\\x80x"},                             // a stray continuation byte
      {"\xc3", "\\xc3"},                               // cut before its continuation
      {"\xc3(", "\\xc3("},                             // a lead byte without one
      {"\xc0\xaf", "\\xc0\\xaf"},                     // overlong '/'
      {"\xe0\x80\xaf", "\\xe0\\x80\\xaf"},            // overlong, 3 bytes
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},            // a surrogate (U+D800)
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  // past U+10FFFF
      {"\xe6\x97", "\\xe6\\x97"},                     // 日 cut short
  };
  for (const auto& [in, want] : bad) EXPECT_EQ(escape_control_bytes(in), want);
  // C1 controls (NEL U+0085, CSI U+009B) and the separators U+2028/U+2029
  // are well-formed but break lines or start terminal escapes: escaped too,
  // byte by byte; U+00A0 (the first character past them) is kept.
  EXPECT_EQ(escape_control_bytes("a\xc2\x85" "b\xc2\x9b" "c\xe2\x80\xa8" "d\xe2\x80\xa9" "e\xc2\xa0"),
            "a\\xc2\\x85b\\xc2\\x9bc\\xe2\\x80\\xa8d\\xe2\\x80\\xa9e\xc2\xa0");
  EXPECT_EQ(escape_control_bytes(escape_control_bytes("x\xff\n")), escape_control_bytes("x\xff\n"));
  // Escaping comes before the cut: 300 bytes that each need \xNN stay a
  // short quote, and no escape is split.
  const std::string latin1(300, '\xe9');
  const std::string q = quote_input(latin1);
  EXPECT_LE(q.size(), kQuoteLimit + 20) << q;
  EXPECT_EQ(q.substr(q.size() - 16), "...' (300 bytes)") << q;
  EXPECT_EQ(q.substr(1, 8), "\\xe9\\xe9");
  EXPECT_EQ((q.rfind("...'") - 1) % 4, 0u) << "an escape was split: " << q;
  const Error e(Error::Kind::Format, "w.safetensors: tensor 'out_proj.\xff\xfe' is bad");
  EXPECT_STREQ(e.what(), "w.safetensors: tensor 'out_proj.\\xff\\xfe' is bad");
  EXPECT_EQ(detail::printable("\xc3\xa9\xff"), "\xc3\xa9\\xff");
}

// Sizes the options allow but no machine holds (each past a PiB, so the
// test means the same on any host) fail in one line naming the field,
// before any allocation: not std::length_error, std::bad_alloc or the
// kernel's OOM killer.
TEST(MemoryRefusals, ModulesTrainingAndProgramsNameTheirSizes) {
  MultiheadAttentionConfig mha;
  mha.embed_dim = int64_t{1} << 31;
  mha.num_heads = 1;
  EXPECT_EQ(error_of([&] { BasicMultiheadAttention<float> m(mha); }).rfind("embed_dim: the module's parameters (embed_dim 2147483648", 0), 0u)
      << error_of([&] { BasicMultiheadAttention<float> m(mha); });
  mha.embed_dim = 8;
  mha.num_heads = 2;
  mha.kdim = int64_t{1} << 50;
  const std::string kdim = error_of([&] { BasicMultiheadAttention<double> m(mha); });
  EXPECT_EQ(kdim.rfind("kdim: the module's parameters (embed_dim 8, kdim 1125899906842624", 0), 0u) << kdim;
  EXPECT_NE(kdim.find("more than this machine's"), std::string::npos) << kdim;

  GroupedQueryAttentionConfig gqa;
  gqa.embed_dim = 16;
  gqa.num_heads = 4;
  gqa.head_dim = int64_t{1} << 36;
  const std::string head = error_of([&] { GroupedQueryAttention<float> m(gqa); });
  EXPECT_EQ(head.rfind("head_dim: the module's parameters (embed_dim 16, 4 heads of head_dim 68719476736", 0), 0u)
      << head;
  // Past 2^40 rows the product itself is refused, before it can wrap.
  gqa.head_dim = int64_t{1} << 62;
  EXPECT_EQ(error_of([&] { GroupedQueryAttention<float> m(gqa); }),
            "head_dim: expected num_heads x head_dim of at most 2^40 (the rows of q_proj.weight), got num_heads 4 x "
            "head_dim 4611686018427387904");

  ModelConfig model;
  TrainOptions options;
  options.batch = int64_t{1} << 40;
  const std::string step = error_of([&] { Trainer t(make_task("reverse", 10, 8), model, options); });
  EXPECT_EQ(step.rfind("training: one training step (batch 1099511627776 x sequence_length 8", 0), 0u) << step;

  // Summed per example (train --parallel data), a pass holds one example:
  // 2^24 sequences of 8 tokens over 4096 symbols need ~2 TiB of logits in
  // one pass over all (refused), ~1 GiB of batch arrays one example a pass.
  options.batch = int64_t{1} << 24;
  const std::string batched = error_of([&] { Trainer t(make_task("reverse", 4096, 8), model, options); });
  EXPECT_NE(batched.find("all in one pass"), std::string::npos) << batched;
  options.gradients = GradientSum::PerExample;
  EXPECT_EQ(error_of([&] { Trainer t(make_task("reverse", 4096, 8), model, options); }), "");

  // An experiment checks each task's largest run (3 layers here) before
  // its first.
  ExperimentOptions experiment;
  experiment.tasks = {"lesson"};
  experiment.layers = {1, 3};
  experiment.train.batch = int64_t{1} << 30;
  EXPECT_EQ(error_of([&] { experiment.validate(); }), "");
  const std::string runs = error_of([&] { experiment.check_fits(); });
  EXPECT_EQ(runs.rfind("training: one training step (batch 1073741824 x sequence_length 16 tokens, all in one pass "
                       "through 3 layers", 0), 0u) << runs;
  experiment.train.batch = 32;
  EXPECT_EQ(error_of([&] { experiment.check_fits(); }), "");

  EXPECT_EQ(error_of([] { check_fits_in_memory("--prompt-len", "a prompt", 1e18, "shorter"); }).rfind(
                "--prompt-len: a prompt would need ", 0),
            0u);
  EXPECT_EQ(error_of([] { check_fits_in_memory("--prompt-len", "a prompt", 1e3); }), "");
}

}  // namespace
}  // namespace multihead
