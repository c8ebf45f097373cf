// src/explain/html_report.cpp: the report as one self-contained HTML page.
// The template, style and script live in src/explain/assets/ and are
// embedded at build time (cmake/embed_report_assets.cmake); the page loads
// nothing else (its Content-Security-Policy allows no source at all).
#include <string>
#include <string_view>
#include <vector>

#include "explain/json_text.hpp"
#include "explain/report_assets.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"

namespace multihead::explain {
namespace {

// Beyond this the page is a wall of lines and cells (the head view draws up
// to H·L·S lines, each map L·S cells): bertviz JSON or the text view serve
// long inputs.
constexpr int64_t kMaxTokens = 128;

std::string escape_html(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

struct Fill {
  std::string_view marker;
  std::string value;
};

// The template with each marker replaced, in one pass over the template
// only: a value is never searched again, so a token that reads "@JS@"
// stays a token.
std::string fill(std::string_view text, const std::vector<Fill>& fills) {
  std::string out;
  std::size_t at = 0;
  for (const Fill& f : fills) {
    const std::size_t found = text.find(f.marker, at);
    if (found == std::string_view::npos)
      throw Error(Error::Kind::Format, "report template: marker " + std::string(f.marker) + " missing");
    out.append(text.substr(at, found - at));
    out += f.value;
    at = found + f.marker.size();
  }
  out.append(text.substr(at));
  return out;
}

}  // namespace

std::string html_report(const Report& r) {
  validate(r);
  const auto L = static_cast<int64_t>(r.query_tokens.size()), S = static_cast<int64_t>(r.key_tokens.size());
  if (L > kMaxTokens || S > kMaxTokens)
    throw Error(Error::Kind::Value, "tokens: the HTML report shows at most " + std::to_string(kMaxTokens) +
                                        " query and key tokens, got " + std::to_string(L) + " and " +
                                        std::to_string(S) + " (the text view and the bertviz export have no limit)");
  // The data's '<' are \u003c escapes (json_string), so it cannot close the
  // <script> element; the title's HTML characters become entities. Markers
  // in template order.
  const std::string page = fill(detail::kReportHtml, {{"@TITLE@", escape_html(escape_control_bytes(r.title))},
                                                      {"@CSS@", std::string(detail::kReportCss)},
                                                      {"@DATA@", report_json(r)},
                                                      {"@JS@", std::string(detail::kReportJs)}});
  return page;
}

}  // namespace multihead::explain
