// tools/inspect_command.cpp: `multihead inspect FILE`, what a safetensors or
// .npy file holds, and for safetensors the MultiheadAttention modules in it
// and the --prefix that runs each. Which modules there are, and what their
// tensors and metadata say, is the library's find_attention_modules; this
// file only prints.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {
namespace {

std::string yes_no(bool b) { return b ? "true" : "false"; }

// A name, key, value or path from the file (or the command line) as printed:
// control bytes become \xNN, so a hostile name cannot add lines to the
// table, clear the terminal or cut the line short with a NUL.
std::string shown(const std::string& text) { return escape_control_bytes(text); }

// A value only the metadata can give, or why it is not known.
template <class V, class F>
std::pair<std::string, std::string> from_metadata(const std::optional<V>& v, F&& text) {
  if (v) return {text(*v), "(metadata)"};
  return {"unknown", "(not in metadata)"};
}

struct TensorRow {
  std::string name;
  DType dtype;
  Shape shape;
};

// The decoded tensors, the integer ones and those left undecoded (inspect
// reads names and shapes only), in one list in name order: to a reader of
// the table they are all the file's tensors.
std::vector<TensorRow> tensor_rows(const SafetensorsFile& file) {
  std::vector<TensorRow> rows;
  for (const auto& [name, t] : file.tensors) rows.push_back({shown(name), t.dtype, t.values.shape()});
  for (const auto& [name, t] : file.integer_tensors) rows.push_back({shown(name), t.dtype, t.shape});
  for (const auto& [name, t] : file.undecoded) rows.push_back({shown(name), t.dtype, t.shape});
  std::sort(rows.begin(), rows.end(), [](const TensorRow& a, const TensorRow& b) { return a.name < b.name; });
  return rows;
}

void print_tensors(const SafetensorsFile& file) {
  const std::vector<TensorRow> rows = tensor_rows(file);
  std::size_t width = 4;
  for (const TensorRow& r : rows) width = std::max(width, r.name.size());
  std::printf("tensors (%zu):\n", rows.size());
  for (const TensorRow& r : rows)
    std::printf("  %-*s  %-8s  %s\n", static_cast<int>(width), r.name.c_str(), to_string(r.dtype).c_str(),
                shape_to_string(r.shape).c_str());
}

void print_metadata(const SafetensorsFile& file) {
  if (file.metadata.empty()) {
    std::printf("metadata: none\n");
    return;
  }
  std::printf("metadata (%zu):\n", file.metadata.size());
  for (const auto& [key, value] : file.metadata)
    std::printf("  %s = %s\n", shown(key).c_str(), shown(value).c_str());
}

void print_module(const FoundModule& m, const std::string& path) {
  const std::string prefix = shown(m.prefix);
  std::printf("  %s\n", prefix.empty() ? "(no prefix: the file is one module's state_dict)" : prefix.c_str());
  if (!m.problem.empty()) {
    std::printf("    cannot be loaded: %s\n", m.problem.c_str());
    return;
  }
  const auto row = [](const char* key, const std::pair<std::string, std::string>& value) {
    std::printf("    %-14s %-8s %s\n", key, value.first.c_str(), value.second.c_str());
  };
  const auto shape = [](const std::string& v) { return std::pair<std::string, std::string>{v, "(tensor shapes)"}; };
  row("embed_dim", shape(std::to_string(m.embed_dim)));
  row("kdim", shape(std::to_string(m.kdim)));
  row("vdim", shape(std::to_string(m.vdim)));
  row("bias", shape(yes_no(m.bias)));
  row("add_bias_kv", shape(yes_no(m.add_bias_kv)));
  row("num_heads", from_metadata(m.num_heads, [](int64_t h) { return std::to_string(h); }));
  row("batch_first", from_metadata(m.batch_first, yes_no));
  row("add_zero_attn", from_metadata(m.add_zero_attn, yes_no));
  row("dropout", from_metadata(m.dropout, [](double p) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", p);
        return std::string(buf);
      }));
  std::printf("    run it:        multihead forward --weights %s%s%s --query …\n", shown(path).c_str(),
              prefix.empty() ? "" : " --prefix ", prefix.c_str());
}

void inspect_safetensors(const std::string& path) {
  const SafetensorsFile file = read_safetensors(path, Sixteen::Decode, no_tensors());  // names and shapes
  std::printf("%s: safetensors\n", shown(path).c_str());
  print_tensors(file);
  print_metadata(file);
  const std::vector<FoundModule> modules = find_attention_modules(file, path);
  std::printf("MultiheadAttention modules (%zu):%s\n", modules.size(), modules.empty() ? " none" : "");
  for (const FoundModule& m : modules) print_module(m, path);
}

void inspect_npy(const std::string& path) {
  const LoadedTensor t = read_npy(path, path);
  std::printf("%s: .npy array\n  dtype  %s\n  shape  %s\n", shown(path).c_str(), to_string(t.dtype).c_str(),
              shape_to_string(t.values.shape()).c_str());
}

}  // namespace

Runner add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand(
      "inspect", "List the tensors, metadata and MultiheadAttention modules (with their --prefix) of a file");
  c->add_option("file", *path, "a safetensors or .npy file")->required()->check(multihead::cli::path());
  return [path] {
    const FileFormat format = detect_file_format(*path);
    if (format == FileFormat::Npy) return inspect_npy(*path);
    if (format == FileFormat::Safetensors) return inspect_safetensors(*path);
    throw Error(Error::Kind::Format, *path + ": this is " + describe(format) +
                                         "; inspect reads safetensors and .npy files");
  };
}

}  // namespace multihead::cli
