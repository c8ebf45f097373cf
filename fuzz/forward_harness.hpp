// fuzz/forward_harness.hpp: one fuzz input -> weights, inputs, options ->
// BasicMultiheadAttention<T>::forward (or forward_textbook). Shared by the
// libFuzzer target (fuzz/fuzz_forward.cpp) and by the regression test that
// replays saved inputs (tests/test_fuzz_regressions.cpp), so both run exactly
// the same code.
//
// Input layout (all integers little-endian):
//   byte 0  flags: 1 need_weights, 2 average_attn_weights, 4 is_causal,
//           8 masked_rows = NaN, 16 textbook form, 32 double (else float),
//           64 training, 128 check_finite
//   byte 1  bits 0-1 kernel (auto, reference, materialized, flash),
//           bits 2-3 batch_first override (0 none, 1 false, 2 true, 3 none),
//           16 add_zero_attn override, 32 num_heads override,
//           64 two threads (else one), 128 dropout override
//   byte 2  num_heads override (0 … 255; 0 must be rejected)
//   byte 3  dropout override = byte / 250 (so > 1 is tried too), and the
//           dropout seed
//   byte 4  present: 1 key, 2 value, 4 key_padding_mask, 8 attn_mask
//   then six blobs, each a u32 length and that many bytes (a length past
//   the end takes what is left; missing blobs are empty):
//     weights (.safetensors), query, key, value, key_padding_mask,
//     attn_mask (.npy)
// A blob is used only when its presence bit is set (weights and query
// always are). Like `multihead forward`: key defaults to the query, value
// to the key; bool masks are boolean, float masks additive; a bool query,
// key or value is rejected.
//
// The weights go through the library's own load_weights (config inference
// from tensor names and metadata), reading the blob from a memfd: the
// library has no in-memory variant, and the memfd costs one write and one
// read per input (measured in docs/fuzzing.md).
//
// Contract checked: forward either returns or throws multihead::Error, whose
// message is one non-empty line. On return, the output has the query's
// shape, the weights are present iff need_weights with the documented shape,
// and every weight is NaN or in [0, 1] (softmax rows; checked when not
// training). A broken contract throws HarnessFailure; any other exception
// escapes. std::bad_alloc is reported as OutOfMemory, which the fuzzer
// tolerates (libFuzzer and ASan report large allocations before they could
// throw) and the regression test does not: below the cost cap a forward
// needs a few MB, so bad_alloc means an allocation the input does not bound.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead::fuzz {

// The harness found a result that breaks forward's contract.
class HarnessFailure : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

enum class Outcome {
  Ran,          // forward returned and its result met the contract
  Rejected,     // the library threw multihead::Error
  OutOfMemory,  // the library threw std::bad_alloc
  Skipped       // too short for the header, or too costly to run
};

// Work (multiply-adds, roughly) above which an input is skipped, so one
// iteration stays around a millisecond under ASan. Computed from the parsed
// shapes, never from the bytes' claims.
inline constexpr double kMaxWork = 2e6;

// Header bits (layout above).
namespace bits {
// byte 0
inline constexpr uint8_t kNeedWeights = 1, kAverage = 2, kCausal = 4, kNanRows = 8, kTextbook = 16,
                         kDouble = 32, kTraining = 64, kCheckFinite = 128;
// byte 1 (bits 0-1 the kernel, bits 2-3 the batch_first override)
inline constexpr uint8_t kKernel = 3, kZeroAttn = 16, kHeads = 32, kTwoThreads = 64, kDropout = 128;
inline constexpr int kBatchFirstShift = 2;
// byte 4
inline constexpr uint8_t kKey = 1, kValue = 2, kKeyPaddingMask = 4, kAttnMask = 8;
}  // namespace bits

// The input split into its fields (layout above). Blobs, in order:
// weights, query, key, value, key_padding_mask, attn_mask.
struct InputParts {
  static constexpr std::size_t kHeader = 5, kBlobs = 6;
  enum Blob { Weights, Query, Key, Value, KeyPaddingMask, AttnMask };
  std::array<uint8_t, kHeader> header{};
  std::array<std::string, kBlobs> blobs;
};

// false when the input is shorter than the header. A blob length past the
// end takes what is left; missing blobs are empty.
inline bool split_input(const uint8_t* data, std::size_t size, InputParts& parts) {
  if (size < InputParts::kHeader) return false;
  std::copy_n(data, InputParts::kHeader, parts.header.begin());
  std::size_t at = InputParts::kHeader;
  for (std::string& blob : parts.blobs) {
    if (size - at < 4) {
      blob.clear();
      at = size;
      continue;
    }
    const std::size_t n = static_cast<std::size_t>(data[at]) | static_cast<std::size_t>(data[at + 1]) << 8 |
                          static_cast<std::size_t>(data[at + 2]) << 16 |
                          static_cast<std::size_t>(data[at + 3]) << 24;
    at += 4;
    const std::size_t take = std::min(n, size - at);
    blob.assign(reinterpret_cast<const char*>(data) + at, take);
    at += take;
  }
  return true;
}

inline std::string join_input(const InputParts& parts) {
  std::string out(parts.header.begin(), parts.header.end());
  for (const std::string& blob : parts.blobs) {
    const auto n = static_cast<uint32_t>(blob.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i) & 0xff));
    out += blob;
  }
  return out;
}

namespace detail {

// A memfd holding the weights blob, so load_weights reads it by path.
// One per thread, reused across inputs.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("fuzz-weights", MFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& write(const uint8_t* data, std::size_t size) {
    // Overwrite, then cut the tail: truncating to 0 first would free and
    // fault in the pages again on every input.
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) throw std::runtime_error("pwrite failed");
      done += static_cast<std::size_t>(n);
    }
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) throw std::runtime_error("ftruncate failed");
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// Dimension i, or 0 when the shape has fewer; in double, since shapes can
// claim 2^62 in a zero-sized tensor and products must not overflow.
inline double dim(const Shape& s, std::size_t i) {
  return i < s.size() ? static_cast<double>(s[i]) : 0.0;
}

// Roughly the multiply-adds a forward of these shapes needs: projections,
// scores and weighted sums, and the weights tensor. Shapes that forward will
// reject cost what their interpretation as valid shapes would.
inline double estimate_work(const MultiheadAttentionConfig& c, const Shape& q, const Shape& k) {
  const bool batched = q.size() == 3;
  const bool bf = c.batch_first;
  const double B = batched ? dim(q, bf ? 0 : 1) : 1.0;
  const double L = batched ? dim(q, bf ? 1 : 0) : dim(q, 0);
  const double S = batched ? dim(k, bf ? 1 : 0) : dim(k, 0);
  const double St = S + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  const double E = static_cast<double>(c.embed_dim);
  const double H = static_cast<double>(c.num_heads > 0 ? c.num_heads : 1);
  const double Ek = static_cast<double>(c.key_dim()), Ev = static_cast<double>(c.value_dim());
  return B * L * E * E * 2 + B * S * E * (Ek + Ev) + B * L * St * (2 * E + H);
}

// error.hpp promises one line naming the tensor; the CLI prints it as is.
inline void expect_one_line(const Error& e) {
  const std::string m = e.what();
  if (m.empty() || m.find('\n') != std::string::npos)
    throw HarnessFailure("multihead::Error message is not one non-empty line: '" + m + "'");
}

template <class T>
Tensor<T> as(const LoadedTensor& t) {
  return tensor_cast<T>(t.values);
}

template <class T>
std::unique_ptr<Mask<T>> mask_of(const std::optional<LoadedTensor>& t) {
  if (!t) return nullptr;
  if (t->dtype == DType::Bool)
    return std::make_unique<Mask<T>>(Mask<T>::boolean(tensor_cast<uint8_t>(t->values)));
  return std::make_unique<Mask<T>>(Mask<T>::additive(tensor_cast<T>(t->values)));
}

struct Inputs {
  uint8_t flags = 0, select = 0, heads = 0, dropout = 0;
  LoadedWeights weights;
  LoadedTensor query;
  std::optional<LoadedTensor> key, value, key_padding_mask, attn_mask;
};

template <class T>
void run_typed(const Inputs& in) {
  const MultiheadAttentionConfig& c = in.weights.config;
  const Tensor<T> query = as<T>(in.query);
  std::optional<Tensor<T>> key, value;
  if (in.key) key = as<T>(*in.key);
  if (in.value) value = as<T>(*in.value);
  // The same objects as the CLI passes, so the fused form's self-attention
  // fast path (one packed projection) is reachable.
  const Tensor<T>& k = key ? *key : query;
  const Tensor<T>& v = value ? *value : k;
  const auto kpm = mask_of<T>(in.key_padding_mask);
  const auto am = mask_of<T>(in.attn_mask);

  const BasicMultiheadAttention<T> mha(c, cast_parameters<T>(in.weights.parameters));
  ForwardOptions<T> o;
  o.key_padding_mask = kpm.get();
  o.attn_mask = am.get();
  o.need_weights = in.flags & bits::kNeedWeights;
  o.average_attn_weights = in.flags & bits::kAverage;
  o.attention.is_causal = in.flags & bits::kCausal;
  o.attention.masked_rows = (in.flags & bits::kNanRows) ? MaskedRowPolicy::NaN : MaskedRowPolicy::Zeros;
  o.training = in.flags & bits::kTraining;
  o.attention.check_finite = in.flags & bits::kCheckFinite;
  o.attention.kernel = static_cast<AttentionKernel>(in.select & bits::kKernel);
  o.attention.num_threads = (in.select & bits::kTwoThreads) ? 2 : 1;
  o.attention.dropout_seed = in.dropout;
  const bool textbook = in.flags & bits::kTextbook;

  const ForwardResult<T> r = textbook ? mha.forward_textbook(query, k, v, o) : mha.forward(query, k, v, o);

  // forward accepted the shapes, so they are the documented ones.
  if (r.output.shape() != query.shape())
    throw HarnessFailure("output: expected shape " + shape_to_string(query.shape()) + ", got " +
                         shape_to_string(r.output.shape()));
  if (r.attn_weights.has_value() != o.need_weights)
    throw HarnessFailure(std::string("attn_weights: expected ") + (o.need_weights ? "present" : "absent"));
  if (!r.attn_weights) return;
  const bool batched = query.dim() == 3;
  const int64_t B = batched ? query.size(c.batch_first ? 0 : 1) : 1;
  const int64_t L = batched ? query.size(c.batch_first ? 1 : 0) : query.size(0);
  const int64_t S = batched ? k.size(c.batch_first ? 1 : 0) : k.size(0);
  // S comes from an untrusted shape: with B = 0 it may be INT64_MAX, and
  // S + 1 would overflow. forward must have refused such a key length.
  int64_t St = 0;
  if (__builtin_add_overflow(S, int64_t{c.add_bias_kv} + int64_t{c.add_zero_attn}, &St))
    throw HarnessFailure("forward accepted key length " + std::to_string(S) +
                         " whose extra key positions overflow int64");
  const int64_t H = c.num_heads;
  Shape expected = o.average_attn_weights ? Shape{B, L, St} : Shape{B, H, L, St};
  if (!batched) expected.erase(expected.begin());
  const Tensor<T>& w = *r.attn_weights;
  if (w.shape() != expected)
    throw HarnessFailure("attn_weights: expected shape " + shape_to_string(expected) + ", got " +
                         shape_to_string(w.shape()));
  if (o.training) return;  // dropout scales kept weights by 1/(1-p)
  // Softmax rows (or zeros, or NaN), and their mean over heads.
  const T tol = std::is_same_v<T, float> ? T(1e-5) : T(1e-12);
  for (int64_t i = 0; i < w.numel(); ++i)
    if (!std::isnan(w[i]) && !(w[i] >= T(0) && w[i] <= T(1) + tol))
      throw HarnessFailure("attn_weights: element " + std::to_string(i) + " = " + std::to_string(w[i]) +
                           " is outside [0, 1]");
}

}  // namespace detail

// Runs one fuzz input. Returns how it ended (and, if `why` is given, the
// error message or the reason for skipping); throws HarnessFailure when the
// result breaks the contract, and lets any exception other than
// multihead::Error and std::bad_alloc escape.
inline Outcome run_forward_input(const uint8_t* data, std::size_t size, std::string* why = nullptr) {
  auto say = [why](const std::string& text) {
    if (why) *why = text;
  };
  InputParts parts;
  if (!split_input(data, size, parts)) {
    say("shorter than the 5-byte header");
    return Outcome::Skipped;
  }
  detail::Inputs in;
  in.flags = parts.header[0];
  in.select = parts.header[1];
  in.heads = parts.header[2];
  in.dropout = parts.header[3];
  const uint8_t present = parts.header[4];
  using P = InputParts;

  thread_local detail::MemFile file;
  const std::string& w = parts.blobs[P::Weights];
  const std::string& path = file.write(reinterpret_cast<const uint8_t*>(w.data()), w.size());
  try {
    WeightOverrides ov;
    const int bf = (in.select >> bits::kBatchFirstShift) & 3;
    if (bf == 1 || bf == 2) ov.batch_first = bf == 2;
    if (in.select & bits::kZeroAttn) ov.add_zero_attn = true;
    if (in.select & bits::kHeads) ov.num_heads = in.heads;
    if (in.select & bits::kDropout) ov.dropout = in.dropout / 250.0;
    in.weights = load_weights(path, ov);
    // Numbers, not booleans, for query, key and value (as the CLI demands).
    auto npy = [&](P::Blob b, const char* name) {
      const std::string& bytes = parts.blobs[b];
      return parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
    };
    auto input = [&](P::Blob b, const char* name) {
      LoadedTensor t = npy(b, name);
      if (t.dtype == DType::Bool)
        throw Error(Error::Kind::Value, std::string(name) + ": expected dtype float32 or float64, got bool");
      return t;
    };
    in.query = input(P::Query, "query");
    if (present & bits::kKey) in.key = input(P::Key, "key");
    if (present & bits::kValue) in.value = input(P::Value, "value");
    if (present & bits::kKeyPaddingMask) in.key_padding_mask = npy(P::KeyPaddingMask, "key_padding_mask");
    if (present & bits::kAttnMask) in.attn_mask = npy(P::AttnMask, "attn_mask");
  } catch (const Error& e) {
    detail::expect_one_line(e);
    say(e.what());
    return Outcome::Rejected;  // by a reader or by the weights' validation
  }

  const Shape& k_shape = in.key ? in.key->values.shape() : in.query.values.shape();
  const double work = detail::estimate_work(in.weights.config, in.query.values.shape(), k_shape);
  if (!(work <= kMaxWork)) {
    say("estimated work " + std::to_string(work) + " exceeds " + std::to_string(kMaxWork));
    return Outcome::Skipped;
  }

  try {
    if (in.flags & bits::kDouble) detail::run_typed<double>(in);
    else detail::run_typed<float>(in);
  } catch (const Error& e) {
    detail::expect_one_line(e);
    say(e.what());
    return Outcome::Rejected;
  } catch (const std::bad_alloc&) {
    say("std::bad_alloc");
    return Outcome::OutOfMemory;
  }
  say("");
  return Outcome::Ran;
}

}  // namespace multihead::fuzz
