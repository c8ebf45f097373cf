// tools/forward_command.cpp: `multihead forward`, torch.nn.MultiheadAttention's
// forward on .npy files. Flag names mirror PyTorch's argument names.
//
// The computation runs in float64 when the query file is float64, otherwise
// in float32; outputs are written in that type. --dtype bf16|f16 runs the
// 16-bit module (NarrowMultiheadAttention) instead: the .npy inputs and the
// weights are rounded to the 16-bit type on the way in (exact for a bf16/f16
// checkpoint and for inputs that are already such values), the output is
// widened to float32 on the way out. Every file flag is checked
// before the weights are read (file_flags), and the outputs are written all
// or nothing after the forward pass, so a failed run leaves no file behind.
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "checkpoint_hints.hpp"
#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "gqa_cli.hpp"
#include "mpi_session.hpp"
#include "parallel.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {
namespace {

struct ForwardArgs {
  std::string weights, prefix, query, key, value, key_padding_mask, attn_mask, out, attn_weights_out;
  bool is_causal = false, need_weights = false, no_average = false, training = false;
  std::string causal_align;  // "" = top-left (PyTorch's)
  std::optional<int64_t> window;
  std::optional<double> softcap;
  bool alibi = false;
  bool check_finite = false, verbose = false;
  std::optional<int64_t> num_heads;
  bool batch_first_flag = false;
  bool add_zero_attn = false;
  std::optional<double> dropout;
  uint64_t dropout_seed = 0;
  std::string masked_rows = "zeros", form = "fused", kernel = "auto";
  int threads = 0;
  int repeat = 1;
  GqaFlags gqa;  // --num-kv-heads selects the grouped-query module (run_gqa_forward)
  std::string weights_heads, weights_rows;  // "" = all; else "0,3" or "5:9" or both mixed
  std::string dtype = "f32";
  std::string parallel;  // "" or heads, ring, ulysses (tools/parallel.hpp)
};

// --weights-heads / --weights-rows: comma-separated indices and half-open
// ranges a:b (a, a+1, …, b−1, as Python's slices), e.g. "0,3" or "5:9,12".
// Whether they are in range is the library's check (it knows H and L).
std::vector<int64_t> parse_index_list(const std::string& flag, const std::string& text) {
  const auto fail = [&] {
    return Error(Error::Kind::Value, flag + ": expected comma-separated indices or ranges a:b (b excluded), e.g. "
                                            "0,3 or 5:9, got " + quote_input(text));
  };
  const auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) throw fail();
    return static_cast<int64_t>(std::stoll(s));
  };
  std::vector<int64_t> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) {
      out.push_back(number(item));
    } else {
      const int64_t a = number(item.substr(0, colon)), b = number(item.substr(colon + 1));
      // At most 2^24 indices in all: more rows than any weights that fit.
      if (b <= a || b - a > (int64_t{1} << 24) - static_cast<int64_t>(out.size())) throw fail();
      for (int64_t i = a; i < b; ++i) out.push_back(i);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

template <class T>
Tensor<T> as(const LoadedTensor& t) {
  return tensor_cast<T>(t.values);
}

// query, key and value must hold numbers, not booleans.
LoadedTensor read_input(const std::string& path, const std::string& name) {
  LoadedTensor t = read_npy(path, name);
  if (t.dtype == DType::Bool)
    throw Error(Error::Kind::Value, name + ": expected dtype float32 or float64, got bool (" + path + ")");
  return t;
}

// A mask file: bool (or uint8) is a boolean mask, float an additive one.
template <class T>
std::unique_ptr<Mask<T>> read_mask(const std::string& path, const std::string& name) {
  if (path.empty()) return nullptr;
  LoadedTensor t = read_npy(path, name);
  if (t.dtype == DType::Bool)
    return std::make_unique<Mask<T>>(Mask<T>::boolean(tensor_cast<uint8_t>(t.values)));
  return std::make_unique<Mask<T>>(Mask<T>::additive(tensor_cast<T>(t.values)));
}

// --verbose: one line on stderr, so that `--out -` stays clean.
// The options of nn.MultiheadAttention.forward and ours that both forward
// paths (float and 16-bit) take from the flags: the masks, causality, the
// window, soft-cap, ALiBi, dropout, masked rows, the kernel and threads.
// need_weights stays off (the float path sets it from --attn-weights-out).
template <class T>
ForwardOptions<T> forward_options(const ForwardArgs& args, const Mask<T>* key_padding_mask, const Mask<T>* attn_mask) {
  ForwardOptions<T> o;
  o.key_padding_mask = key_padding_mask;
  o.attn_mask = attn_mask;
  o.need_weights = false;
  o.attention.is_causal = args.is_causal;
  o.attention.causal_alignment =
      args.causal_align == "bottom-right" ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
  o.attention.window = args.window;
  o.attention.softcap = args.softcap;
  o.alibi = args.alibi;
  o.training = args.training;
  o.attention.dropout_seed = args.dropout_seed;
  o.attention.masked_rows = args.masked_rows == "nan" ? MaskedRowPolicy::NaN : MaskedRowPolicy::Zeros;
  o.attention.kernel = parse_attention_kernel(args.kernel);
  o.attention.num_threads = args.threads;
  o.attention.check_finite = args.check_finite;
  return o;
}

template <class T>
void print_summary(const ForwardArgs& args, const LoadedWeights& w, const ForwardResult<T>& r, double ms) {
  std::string line = "multihead forward: output " + shape_to_string(r.output.shape());
  if (r.attn_weights) line += ", attn_weights " + shape_to_string(r.attn_weights->shape());
  line += sizeof(T) == 8 ? ", float64" : ", float32";
  line += "; embed_dim " + std::to_string(w.config.embed_dim) + ", num_heads " + std::to_string(w.config.num_heads);
  line += "; kernel " + args.kernel + ", form " + args.form + "; ";
  char time[64];
  std::snprintf(time, sizeof time, "%.3f ms for %d forward pass%s", ms, args.repeat, args.repeat == 1 ? "" : "es");
  std::fprintf(stderr, "%s%s\n", line.c_str(), time);
}

// `w` is load_weights' result; with --parallel heads only the header's
// (HeadParallelForward then decodes this rank's slices of the file).
template <class T>
void run_forward(const ForwardArgs& args, LoadedWeights& w, const LoadedTensor& query_file, const LoadOptions& load) {
  const Tensor<T> query = as<T>(query_file);
  // key and value default to the query (self-attention): the same tensor, so
  // the fused form can do its single packed in-projection.
  std::optional<Tensor<T>> key, value;
  std::unique_ptr<Mask<T>> key_padding_mask, attn_mask;
  std::optional<BasicMultiheadAttention<T>> module;
  // Every rank reads (and checks) its inputs before any message (--parallel).
  agree_on(args.parallel, [&] {
    if (!args.key.empty()) key = as<T>(read_input(args.key, "key"));
    if (!args.value.empty()) value = as<T>(read_input(args.value, "value"));
    key_padding_mask = read_mask<T>(args.key_padding_mask, "key_padding_mask");
    attn_mask = read_mask<T>(args.attn_mask, "attn_mask");
    if (args.parallel != "heads") module.emplace(w.config, cast_parameters<T>(w.parameters));
  });
  std::optional<HeadParallelForward<T>> heads;
  if (args.parallel == "heads") heads.emplace(args.weights, load, w);  // collective
  const Tensor<T>& k = key ? *key : query;
  const Tensor<T>& v = value ? *value : (key && args.value.empty() ? *key : query);
  ForwardOptions<T> o = forward_options<T>(args, key_padding_mask.get(), attn_mask.get());
  o.need_weights = !args.attn_weights_out.empty();
  o.average_attn_weights = !args.no_average;
  if (!args.weights_heads.empty()) o.weights_heads = parse_index_list("--weights-heads", args.weights_heads);
  if (!args.weights_rows.empty()) o.weights_rows = parse_index_list("--weights-rows", args.weights_rows);

  ForwardResult<T> result;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int r = 0; r < args.repeat; ++r)
      result = heads                   ? heads->forward(query, k, v, o)
               : !args.parallel.empty() ? parallel_mha_forward<T>(args.parallel, w.config, module->parameters(),
                                                                  query, k, v, o)
               : args.form == "textbook" ? module->forward_textbook(query, k, v, o)
                                         : module->forward(query, k, v, o);
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Shape) throw;
    auto shape_of = [](const auto& mask) { return mask ? std::optional(mask->shape()) : std::nullopt; };
    throw_reworded(e, e.kind(), e.what() + layout_hint(w.config, {query.shape(), k.shape(), v.shape(),
                                                                  shape_of(key_padding_mask), shape_of(attn_mask)}));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  if (!writes_outputs()) return;  // rank 0 writes what every rank holds
  std::vector<Output> outputs;
  outputs.push_back({{"--out", args.out}, serialize_npy(result.output)});
  if (result.attn_weights)
    outputs.push_back({{"--attn-weights-out", args.attn_weights_out}, serialize_npy(*result.attn_weights)});
  write_outputs(std::move(outputs));
  if (args.verbose) print_summary(args, w, result, ms);
}

// --dtype bf16 / f16: the 16-bit module, E its element type. Inputs rounded
// to E (from float32: a float64 file is read as float32 first), weights as
// load_weights_narrow gives them (an E checkpoint as stored, with no wider
// copy; any other rounded once), masks kept float32, the output widened to
// float32.
template <class E>
void run_narrow_forward(const ForwardArgs& args, BasicLoadedWeights<E> w, const LoadedTensor& query_file) {
  const Tensor<E> query = round_to<E>(as<float>(query_file), "query");
  std::optional<Tensor<E>> key, value;
  if (!args.key.empty()) key = round_to<E>(as<float>(read_input(args.key, "key")), "key");
  if (!args.value.empty()) value = round_to<E>(as<float>(read_input(args.value, "value")), "value");
  const Tensor<E>& k = key ? *key : query;
  const Tensor<E>& v = value ? *value : (key && args.value.empty() ? *key : query);
  const auto key_padding_mask = read_mask<float>(args.key_padding_mask, "key_padding_mask");
  const auto attn_mask = read_mask<float>(args.attn_mask, "attn_mask");
  const NarrowMultiheadAttention<E> mha(w.config, std::move(w.parameters));
  const ForwardOptions<float> o = forward_options<float>(args, key_padding_mask.get(), attn_mask.get());
  Tensor<E> out;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int r = 0; r < args.repeat; ++r) out = mha.forward(query, k, v, o);
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Shape) throw;
    auto shape_of = [](const auto& mask) { return mask ? std::optional(mask->shape()) : std::nullopt; };
    throw Error(e.kind(), e.what() + layout_hint(w.config, {query.shape(), k.shape(), v.shape(),
                                                            shape_of(key_padding_mask), shape_of(attn_mask)}));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  write_outputs({{{"--out", args.out}, serialize_npy(widen<float>(out))}});
  if (args.verbose)
    std::fprintf(stderr, "multihead forward: output %s, %s (written as float32); embed_dim %lld, num_heads %lld; "
                 "kernel %s, form fused%s; %.3f ms for %d forward pass%s\n",
                 shape_to_string(out.shape()).c_str(), to_string(compute_dtype_of<E>()).c_str(),
                 static_cast<long long>(w.config.embed_dim), static_cast<long long>(w.config.num_heads),
                 args.kernel.c_str(),
                 std::is_same_v<E, bfloat16>
                     ? ("; bf16 attention " + narrow_attention_current() + "; bf16 dot " + bf16_dot_current()).c_str()
                     : "",
                 ms, args.repeat,
                 args.repeat == 1 ? "" : "es");
}

// --dtype bf16 / f16 from the reading of the files on: the weights read
// straight into E (load_weights_narrow), and the notes, each printed once
// after the run (so a failed run prints one line): the compute path
// (compute_dtype_note), then a checkpoint of another dtype rounded to E.
template <class E>
void load_and_run_narrow(const ForwardArgs& args, const LoadOptions& load) {
  constexpr ComputeDtype kDtype = compute_dtype_of<E>();
  BasicLoadedWeights<E> w = load_weights_narrow<E>(args.weights, load);
  const LoadedTensor query = read_input(args.query, "query");
  const std::optional<DType> stored = w.parameter_dtype;
  const std::vector<AssumedSetting> assumed = w.assumed;
  run_narrow_forward<E>(args, std::move(w), query);
  if (!writes_outputs()) return;
  std::vector<std::string> notes = dtype_notes(kDtype, args.dtype, stored);
  notes.push_back(assumed_settings_note(assumed, args.weights));
  print_notes(notes);
}

// --num-kv-heads: the grouped-query module (multihead/grouped_query_attention.hpp,
// weights as tools/gqa_cli.hpp reads them) on a batch-first query,
// self-attention. T: float or double (a float64 --query), or bfloat16 /
// float16 (--dtype): the 16-bit module (NarrowGroupedQueryAttention) with the
// file's parameters rounded once to T (exact for a file of T), the query
// rounded on the way in and the output widened to float32 on the way out;
// the notes as the multi-head module's 16-bit path says them.
template <class T>
using GqaModule = std::conditional_t<std::is_floating_point_v<T>, GroupedQueryAttention<T>, NarrowGroupedQueryAttention<T>>;

template <class T>
void run_gqa_forward(const ForwardArgs& args, const LoadedTensor& query_file) {
  constexpr bool kNarrow = !std::is_floating_point_v<T>;
  std::optional<GqaModule<T>> module;
  std::optional<DType> stored;  // the parameters' dtype on disk
  Tensor<T> x;
  if constexpr (kNarrow) x = round_to<T>(as<float>(query_file), "query");
  else x = as<T>(query_file);
  agree_on(args.parallel, [&] {
    if constexpr (kNarrow) {
      module.emplace(load_gqa_narrow<T>(args.weights, args.prefix, args.num_heads, args.gqa, args.is_causal, &stored));
    } else {
      module.emplace(load_gqa<T>(args.weights, args.prefix, args.num_heads, args.gqa, args.is_causal, &stored));
    }
    const int64_t E = module->config().embed_dim;
    if ((x.dim() != 2 && x.dim() != 3) || x.size(-1) != E)
      throw Error(Error::Kind::Shape, "query: expected (B, L, " + std::to_string(E) + ") (batch first) or (L, " +
                                          std::to_string(E) + ") for the grouped-query module, got " +
                                          shape_to_string(x.shape()));
  });
  const GqaModule<T>& m = *module;
  const int64_t E = m.config().embed_dim;
  const bool unbatched = x.dim() == 2;
  if (unbatched) {
    const int64_t L = x.size(0);
    x = std::move(x).reshaped({1, L, E});
  }
  AttentionOptions o;
  o.window = args.window;
  o.softcap = args.softcap;
  if (args.alibi) o.alibi_slopes = alibi_slopes(m.config().num_heads);
  o.masked_rows = args.masked_rows == "nan" ? MaskedRowPolicy::NaN : MaskedRowPolicy::Zeros;
  o.kernel = parse_attention_kernel(args.kernel);
  o.num_threads = args.threads;
  o.check_finite = args.check_finite;
  Tensor<T> out;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < args.repeat; ++r) {
    if constexpr (kNarrow) out = m.forward(x, o);  // --parallel is refused with --dtype
    else out = args.parallel.empty() ? m.forward(x, o) : parallel_gqa_forward<T>(args.parallel, m, x, o);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (unbatched) {
    const int64_t L = out.size(1);
    out = std::move(out).reshaped({L, E});
  }
  if (!writes_outputs()) return;
  std::string bytes;
  if constexpr (kNarrow) bytes = serialize_npy(widen<float>(out));
  else bytes = serialize_npy(out);
  write_outputs({{{"--out", args.out}, std::move(bytes)}});
  const std::string type = kNarrow ? to_string(compute_dtype_of<T>()) + " (written as float32)"
                           : sizeof(T) == 8 ? "float64" : "float32";
  if (args.verbose)
    std::fprintf(stderr, "multihead forward: output %s, %s; grouped-query, embed_dim %lld, num_heads %lld, "
                 "num_kv_heads %lld, head_dim %lld%s; kernel %s; %.3f ms for %d forward pass%s\n",
                 shape_to_string(out.shape()).c_str(), type.c_str(),
                 static_cast<long long>(E), static_cast<long long>(m.config().num_heads),
                 static_cast<long long>(m.kv_heads()), static_cast<long long>(m.head_dim()),
                 args.gqa.rope.empty() ? "" : (", rope " + args.gqa.rope).c_str(), args.kernel.c_str(), ms,
                 args.repeat, args.repeat == 1 ? "" : "es");
  print_notes(dtype_notes(compute_dtype_of<T>(), args.dtype, stored, sizeof(T) == 8 ? "float64" : "float32"));
}

// Flags of nn.MultiheadAttention that the grouped-query module does not have.
void refuse_mha_only_flags(const ForwardArgs& a, const CLI::Option* batch_first, const CLI::Option* add_zero_attn) {
  const std::pair<const char*, bool> flags[] = {
      {"--key", !a.key.empty()}, {"--value", !a.value.empty()},
      {"--key-padding-mask", !a.key_padding_mask.empty()}, {"--attn-mask", !a.attn_mask.empty()},
      {"--need-weights", a.need_weights}, {"--attn-weights-out", !a.attn_weights_out.empty()},
      {"--no-average-attn-weights", a.no_average}, {"--training", a.training}, {"--dropout", a.dropout.has_value()},
      {"--form", a.form != "fused"}, {"--causal-align", !a.causal_align.empty()},
      {"--batch-first", batch_first->count() > 0}, {"--add-zero-attn", add_zero_attn->count() > 0}};
  for (const auto& [flag, given] : flags)
    if (given)
      throw Error(Error::Kind::Value, std::string(flag) +
                                          ": not used with --num-kv-heads (the grouped-query module runs causal or "
                                          "full self-attention on a batch-first --query, bottom-right aligned)");
}

}  // namespace

Runner add_forward_command(CLI::App& app) {
  auto args = std::make_shared<ForwardArgs>();
  CLI::App* c = app.add_subcommand(
      "forward",
      "Run torch.nn.MultiheadAttention.forward (eval mode unless --training) on .npy inputs");
  c->add_option("--weights", args->weights, "safetensors state_dict (PyTorch key names)")
      ->required()
      ->check(path());
  c->add_option("--prefix", args->prefix,
                "Module to read from a whole model's state_dict, e.g. encoder.layers.0.self_attn. "
                "(`multihead inspect` lists them)");
  c->add_option("--query", args->query, ".npy query: (L, B, E), (B, L, E) with --batch-first, or (L, E)")
      ->required()
      ->check(path());
  c->add_option("--key", args->key, ".npy key (default: the query, i.e. self-attention)")->check(path());
  c->add_option("--value", args->value, ".npy value (default: the key)")->check(path());
  c->add_option("--key-padding-mask", args->key_padding_mask,
                ".npy (B, S) or (S): bool (true = ignore this key) or float (added)")->check(path());
  c->add_option("--attn-mask", args->attn_mask,
                ".npy (L, S) or (B*H, L, S): bool (true = may not attend) or float (added)")->check(path());
  c->add_flag("--is-causal", args->is_causal, "Mask keys after each query (combined with --attn-mask)");
  c->add_option("--causal-align", args->causal_align,
                "Where the queries sit when L != S (docs/semantics.md): top-left (query i at position i, "
                "PyTorch's is_causal; default) or bottom-right (the last query at the last key). Needs "
                "--is-causal, --window or --alibi")
      ->transform(one_of({"top-left", "bottom-right"}));
  c->add_option("--window", args->window,
                "Sliding window of W keys: with --is-causal a query sees its own position and the W-1 before "
                "it; without, keys less than W positions away")
      ->check(integer_in(1, int64_t{1} << 40, "a window of 1 to 2^40 keys"));
  c->add_option("--softcap", args->softcap, "Logit soft-cap C: scores become C*tanh(score/C) (Gemma 2)")
      ->check(positive_number());
  c->add_flag("--alibi", args->alibi,
              "ALiBi position biases with the paper's per-head slopes (the paper's are causal; without "
              "--is-causal, -m*|i-j| is an extension)");
  c->add_option("--num-heads", args->num_heads, "Heads (overrides the weights' metadata)")
      ->check(positive_integer());
  // A plain bool plus the option's count: CLI11 2.1 assigns an optional<bool>
  // flag even when it is absent, which would hide the metadata's batch_first.
  CLI::Option* batch_first = c->add_flag("--batch-first,!--no-batch-first", args->batch_first_flag,
                                         "Inputs are (B, L, E) (overrides the weights' metadata)");
  CLI::Option* add_zero_attn = c->add_flag("--add-zero-attn,!--no-add-zero-attn", args->add_zero_attn,
                                           "Append a zero key and value (overrides metadata)");
  c->add_option("--dropout", args->dropout, "Dropout on attention weights, used with --training")
      ->check(probability());
  c->add_flag("--training", args->training, "Training mode: apply dropout");
  c->add_option("--dropout-seed", args->dropout_seed, "Seed of the dropout mask")->check(unsigned_integer());
  c->add_flag("--need-weights", args->need_weights, "Return attention weights (needs --attn-weights-out)");
  c->add_flag("--no-average-attn-weights", args->no_average, "Per-head weights (B, H, L, S) instead of the mean");
  c->add_option("--weights-heads", args->weights_heads,
                "Only these heads' weights, e.g. 0,3 or 0:4 (a:b = a to b-1): (B, H', L, S) per head, or "
                "their mean with averaging (needs --attn-weights-out; docs/explain.md)");
  c->add_option("--weights-rows", args->weights_rows,
                "Only these query rows' weights, e.g. 5:9 or 0,7: (B, H, L', S); with the flash kernel "
                "only the rows asked for are computed and held (needs --attn-weights-out)");
  c->add_option("--masked-rows", args->masked_rows,
                "A query whose every key is masked gets: zeros or nan (PyTorch's need_weights path)")
      ->transform(one_of({"zeros", "nan"}));
  c->add_option("--form", args->form, "fused (one projection for all heads) or textbook (the lesson's per-head form)")
      ->transform(one_of({"fused", "textbook"}));
  c->add_option("--kernel", args->kernel, "auto, reference, materialized or flash")
      ->transform(one_of({"auto", "reference", "materialized", "flash"}));
  c->add_option("--threads", args->threads, "Threads (0 = default)")->check(non_negative_integer());
  c->add_flag("--check-finite", args->check_finite, "Reject NaN or Inf in inputs and weights");
  c->add_option("--out", args->out, "Output .npy ('-' = standard output; a symlink is written through)")
      ->required()
      ->check(path());
  c->add_option("--attn-weights-out", args->attn_weights_out,
                "Attention weights .npy (implies --need-weights; '-' = standard output)")
      ->check(path());
  c->add_option("--repeat", args->repeat, "Run the forward N times (for timing from outside)")
      ->check(positive_integer());
  c->add_option("--parallel", args->parallel,
                "Run across the ranks of mpirun (docs/distributed.md): heads (each rank a share of the heads), "
                "ring (ring attention: rows split, K/V blocks travel) or ulysses (rows split, all-to-all to "
                "heads); rank 0 writes the outputs. Without mpirun: one rank")
      ->transform(one_of({"heads", "ring", "ulysses"}));
  c->add_flag("--verbose", args->verbose, "Print a one-line summary on stderr (shapes, dtype, kernel, form, time)");
  c->add_option("--dtype", args->dtype,
                "Compute type: f32 (default; float64 for a float64 --query), bf16 or f16. The .npy files stay "
                "float32: inputs and weights are rounded to the 16-bit type on the way in, the output widened "
                "on the way out (docs/precision.md)")
      ->transform(one_of({"f32", "bf16", "f16"}));
  add_gqa_flags(*c, args->gqa,
                "Grouped-query attention with N K/V heads (N divides the heads; 1 = multi-query): the "
                "weights are then q_proj/k_proj/v_proj/o_proj.weight (+ .bias) as Hugging Face Llama names "
                "them (`multihead init --num-kv-heads` writes them), the query is (B, L, E) batch first, "
                "self-attention; --is-causal, --window, --softcap, --alibi, --rope apply");

  return [args, batch_first, add_zero_attn, c] {
    const auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
    // Flags that would change nothing in this combination (issue 22).
    if (given("--dropout-seed") && !args->training)
      throw Error(Error::Kind::Value, "--dropout-seed: needs --training (dropout applies only in training mode)");
    if (given("--kernel") && args->kernel != "auto" && args->form == "textbook")
      throw Error(Error::Kind::Value, "--kernel: not used with --form textbook (the textbook form runs its own plain "
                                      "loops, whatever the kernel)");
    if (args->need_weights && args->attn_weights_out.empty())
      throw Error(Error::Kind::Value, "--need-weights: needs --attn-weights-out to write the weights to");
    if (args->no_average && args->attn_weights_out.empty())
      throw Error(Error::Kind::Value, "--no-average-attn-weights: needs --attn-weights-out");
    if (!args->weights_heads.empty() && args->attn_weights_out.empty())
      throw Error(Error::Kind::Value, "--weights-heads: needs --attn-weights-out to write the weights to");
    if (!args->weights_rows.empty() && args->attn_weights_out.empty())
      throw Error(Error::Kind::Value, "--weights-rows: needs --attn-weights-out to write the weights to");
    if (!args->weights_heads.empty()) (void)parse_index_list("--weights-heads", args->weights_heads);
    if (!args->weights_rows.empty()) (void)parse_index_list("--weights-rows", args->weights_rows);
    if (!args->causal_align.empty() && !args->is_causal && !args->window && !args->alibi)
      throw Error(Error::Kind::Value, "--causal-align: expected with --is-causal, --window or --alibi "
                                      "(it places the queries' positions), got " +
                                          quote_input(args->causal_align) + " alone");
    const ComputeDtype dtype = parse_compute_dtype(args->dtype, "--dtype");
    if (dtype != ComputeDtype::F32) {
      const std::pair<const char*, bool> refused[] = {
          {"--attn-weights-out", !args->attn_weights_out.empty()}, {"--need-weights", args->need_weights},
          {"--form textbook", args->form == "textbook"}, {"--parallel", !args->parallel.empty()}};
      for (const auto& [flag, given] : refused)
        if (given)
          throw Error(Error::Kind::Value, std::string(flag) + ": not available with --dtype " + args->dtype +
                                              " (the 16-bit modules run the fused form on the flash kernel, "
                                              "without attention weights, in one process)");
    }
    if (!args->parallel.empty() && args->form == "textbook")
      throw Error(Error::Kind::Value, "--form textbook: not used with --parallel (the ranks run the fused form)");
    // Everything each rank reads and checks, before the first message
    // (--parallel): the ranks agree on any error here and below.
    agree_on(args->parallel, [&] {
      check_files({{"--weights", args->weights}, {"--query", args->query}, {"--key", args->key},
                   {"--value", args->value}, {"--key-padding-mask", args->key_padding_mask},
                   {"--attn-mask", args->attn_mask}},
                  {{"--out", args->out}, {"--attn-weights-out", args->attn_weights_out}});
    });
    apply_threads(args->threads);
    if (args->gqa.rope.empty() && args->gqa.rope_theta_option->count() > 0)
      throw Error(Error::Kind::Value, "--rope-theta: needs --rope (interleaved or half-split)");
    if (args->gqa.num_kv_heads) {
      refuse_mha_only_flags(*args, batch_first, add_zero_attn);
      LoadedTensor query;
      agree_on(args->parallel, [&] { query = read_input(args->query, "query"); });
      if (dtype == ComputeDtype::BF16) run_gqa_forward<bfloat16>(*args, query);
      else if (dtype == ComputeDtype::F16) run_gqa_forward<float16>(*args, query);
      else if (query.dtype == DType::F64) run_gqa_forward<double>(*args, query);
      else run_gqa_forward<float>(*args, query);
      return;
    }
    if (!args->gqa.rope.empty())
      throw Error(Error::Kind::Value, "--rope: needs --num-kv-heads (rotary embedding is part of the grouped-query "
                                      "module; use --num-kv-heads equal to the heads for plain multi-head)");
    LoadOptions load;
    load.prefix = args->prefix;
    WeightOverrides& ov = load.overrides;
    ov.num_heads = args->num_heads;
    if (batch_first->count() > 0) ov.batch_first = args->batch_first_flag;
    if (add_zero_attn->count() > 0) ov.add_zero_attn = args->add_zero_attn;
    ov.dropout = args->dropout;
    if (dtype == ComputeDtype::BF16) return load_and_run_narrow<bfloat16>(*args, load);
    if (dtype == ComputeDtype::F16) return load_and_run_narrow<float16>(*args, load);
    LoadedWeights w;
    LoadedTensor query;
    agree_on(args->parallel, [&] {
      // --parallel heads: each rank decodes only its slices (run_forward).
      if (args->parallel != "heads") w = load_weights(args->weights, load);
      query = read_input(args->query, "query");
    });
    if (query.dtype == DType::F64) run_forward<double>(*args, w, query, load);
    else run_forward<float>(*args, w, query, load);
    if (!writes_outputs()) return;
    std::vector<std::string> notes = dtype_notes(ComputeDtype::F32, args->dtype, w.parameter_dtype,
                                                 query.dtype == DType::F64 ? "float64" : "float32");
    notes.push_back(assumed_settings_note(w.assumed, args->weights));
    print_notes(notes);
  };
}

}  // namespace multihead::cli
