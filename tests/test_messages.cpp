// tests/test_messages.cpp: quoted input in error messages is cut, with its
// length (multihead/error.hpp: shortened, quote_input; issue 22: a
// 100,000-character word made a 100,178-byte "one-line" error).
#include <gtest/gtest.h>

#include <string>

#include "io/message.hpp"
#include "multihead/error.hpp"

namespace multihead {
namespace {

TEST(QuotedInput, ShortTextIsWhole) {
  EXPECT_EQ(quote_input("abc"), "'abc'");
  EXPECT_EQ(quote_input(std::string(kQuoteLimit, 'x')), "'" + std::string(kQuoteLimit, 'x') + "'");
  EXPECT_EQ(shortened(""), "");
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

}  // namespace
}  // namespace multihead
