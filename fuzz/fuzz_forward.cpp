// fuzz/fuzz_forward.cpp: the path from parsed inputs through shape validation
// into forward. Each input is a header of options plus a safetensors state
// dict and .npy query/key/value/masks (layout in forward_harness.hpp).
// forward either returns a result that meets its contract or throws
// multihead::Error; anything else (a crash, a sanitizer report, another
// exception type, a hang, an allocation past -rss_limit_mb) is a bug.
//
// Byte-level mutations of such an input mostly break a length prefix, the
// JSON or the .npy header, and then fuzz the readers again (they have their
// own targets): measured on a 5-minute run, 41 of 1146 corpus inputs reached
// forward. So this target brings a structure-aware mutator. It mutates one
// field at a time and keeps the others intact, and half of its mutations are
// rewrites through the library's own writers: a tensor reshaped (a dimension
// changed, added, dropped or copied from another input, data resized to
// match), special values (NaN, ±Inf, huge, denormal) planted, the state dict
// regenerated for another configuration or given a wrong tensor or metadata
// entry. The rest are libFuzzer's own byte mutations inside one field.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "forward_harness.hpp"
#include "shape_arithmetic.hpp"

using multihead::DType;
using multihead::LoadedTensor;
using multihead::Shape;
using multihead::Storage;
using multihead::Tensor;
using multihead::fuzz::InputParts;
using multihead::fuzz::nudge_dim;
using multihead::fuzz::small_enough;

extern "C" std::size_t LLVMFuzzerMutate(uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

using Rng = std::mt19937_64;

// Tensors the mutator writes stay small: forward's cost cap would skip
// larger ones anyway.
constexpr int64_t kMaxElements = 4096;

template <class T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
}

bool chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// Uniform in [lo, hi].
std::size_t between(Rng& rng, std::size_t lo, std::size_t hi) {
  return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}

// An iterator to a random element of a non-empty container.
template <class C>
auto any_of(C& c, Rng& rng) {
  return std::next(c.begin(), static_cast<std::ptrdiff_t>(between(rng, 0, c.size() - 1)));
}

std::optional<LoadedTensor> parse(const std::string& blob) {
  try {
    return multihead::parse_npy(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), "blob");
  } catch (const multihead::Error&) {
    return std::nullopt;
  }
}

// Dimensions worth trying: the small ones shapes are made of, 0, and huge
// ones (only valid next to a 0, where they cost no bytes).
int64_t interesting_dim(Rng& rng, bool allow_huge) {
  static const std::vector<int64_t> small = {0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 9, 12, 16};
  static const std::vector<int64_t> huge = {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40,
                                            int64_t{1} << 62, std::numeric_limits<int64_t>::max()};
  return allow_huge && chance(rng, 0.1) ? pick(rng, huge) : pick(rng, small);
}

// Writes `values` (cycled, or random if empty) into a tensor of `shape` as
// .npy of the same kind (bool stays bool), or another kind now and then.
std::optional<std::string> write_npy(const Shape& shape, const Storage<double>& values, DType dtype,
                                     Rng& rng) {
  if (!small_enough(shape, kMaxElements)) return std::nullopt;
  const int64_t n = multihead::shape_numel(shape);
  Storage<double> data(static_cast<std::size_t>(n));
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < n; ++i)
    data[static_cast<std::size_t>(i)] =
        values.empty() ? normal(rng) : values[static_cast<std::size_t>(i) % values.size()];
  const Tensor<double> t(shape, std::move(data));
  if (chance(rng, 0.1)) dtype = pick(rng, std::vector<DType>{DType::Bool, DType::F32, DType::F64});
  if (dtype == DType::Bool) {
    Tensor<uint8_t> b(shape);
    for (int64_t i = 0; i < n; ++i) b[i] = t[i] != 0.0 && !(values.empty() && t[i] < 0.5);
    return multihead::serialize_npy(b);
  }
  if (dtype == DType::F64) return multihead::serialize_npy(t);
  return multihead::serialize_npy(multihead::tensor_cast<float>(t));
}

// A new shape for one .npy blob: one dimension changed, one added or
// dropped, two swapped, or the shape of another blob (with one change).
bool reshape_npy(InputParts& parts, std::size_t which, Rng& rng) {
  const auto t = parse(parts.blobs[which]);
  if (!t) return false;
  Shape s = t->values.shape();
  const int op = std::uniform_int_distribution<int>(0, 4)(rng);
  if (op == 0 && !s.empty()) {
    auto& d = s[between(rng, 0, s.size() - 1)];
    d = chance(rng, 0.5) ? nudge_dim(d, chance(rng, 0.5)) : interesting_dim(rng, true);
  } else if (op == 1 && s.size() < 5) {
    s.insert(s.begin() + static_cast<std::ptrdiff_t>(between(rng, 0, s.size())), interesting_dim(rng, true));
  } else if (op == 2 && !s.empty()) {
    s.erase(any_of(s, rng));
  } else if (op == 3 && s.size() >= 2) {
    std::swap(s[0], s[between(rng, 1, s.size() - 1)]);
  } else {
    const auto other = parse(parts.blobs[between(rng, 1, InputParts::kBlobs - 1)]);
    if (!other) return false;
    s = other->values.shape();
    if (!s.empty() && chance(rng, 0.5)) *any_of(s, rng) = interesting_dim(rng, true);
  }
  const auto bytes = write_npy(s, t->values.vec(), t->dtype, rng);
  if (!bytes) return false;
  parts.blobs[which] = *bytes;
  return true;
}

// Special values planted in one .npy blob (kept in its dtype when it is
// float32 or float64; others are rewritten as float32).
bool plant_values(InputParts& parts, std::size_t which, Rng& rng) {
  auto t = parse(parts.blobs[which]);
  if (!t || t->values.numel() == 0 || t->dtype == DType::Bool) return false;
  static const std::vector<double> special = {
      std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(), 0.0, -0.0, 1e30, -1e30, 3e38, 1e300, 1e-45, 1e-310,
      88.0, -88.0};
  const int count = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int i = 0; i < count; ++i)
    t->values[std::uniform_int_distribution<int64_t>(0, t->values.numel() - 1)(rng)] = pick(rng, special);
  parts.blobs[which] = t->dtype == DType::F64 ? multihead::serialize_npy(t->values)
                                              : multihead::serialize_npy(multihead::tensor_cast<float>(t->values));
  return true;
}

Tensor<float> random_tensor(const Shape& shape, Rng& rng) {
  Tensor<float> t(shape);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : t.vec()) x = u(rng);
  return t;
}

// A whole new state dict: embed_dim, heads, kdim/vdim, bias, bias_kv, and
// metadata drawn at random (mostly consistent, sometimes not).
std::map<std::string, Tensor<float>> new_state_dict(std::map<std::string, std::string>& meta, Rng& rng) {
  const int64_t E = std::uniform_int_distribution<int64_t>(1, 12)(rng);
  std::vector<int64_t> divisors;
  for (int64_t h = 1; h <= E; ++h)
    if (E % h == 0) divisors.push_back(h);
  const int64_t H =
      chance(rng, 0.9) ? pick(rng, divisors) : std::uniform_int_distribution<int64_t>(0, 13)(rng);
  const bool cross = chance(rng, 0.3);
  const int64_t kd = cross ? std::uniform_int_distribution<int64_t>(1, 10)(rng) : E;
  const int64_t vd = cross ? std::uniform_int_distribution<int64_t>(1, 10)(rng) : E;
  std::map<std::string, Tensor<float>> t;
  t.emplace("out_proj.weight", random_tensor({E, E}, rng));
  if (kd != E || vd != E || chance(rng, 0.1)) {
    t.emplace("q_proj_weight", random_tensor({E, E}, rng));
    t.emplace("k_proj_weight", random_tensor({E, kd}, rng));
    t.emplace("v_proj_weight", random_tensor({E, vd}, rng));
  } else {
    t.emplace("in_proj_weight", random_tensor({3 * E, E}, rng));
  }
  if (chance(rng, 0.8)) {
    t.emplace("in_proj_bias", random_tensor({3 * E}, rng));
    t.emplace("out_proj.bias", random_tensor({E}, rng));
  }
  if (chance(rng, 0.3)) {
    t.emplace("bias_k", random_tensor({1, 1, E}, rng));
    t.emplace("bias_v", random_tensor({1, 1, E}, rng));
  }
  meta.clear();
  if (chance(rng, 0.95)) meta["num_heads"] = std::to_string(H);
  if (chance(rng, 0.5)) meta["batch_first"] = chance(rng, 0.5) ? "true" : "false";
  if (chance(rng, 0.3)) meta["add_zero_attn"] = chance(rng, 0.5) ? "true" : "false";
  if (chance(rng, 0.2)) meta["dropout"] = pick(rng, std::vector<std::string>{"0", "0.1", "0.5", "1"});
  if (chance(rng, 0.3)) meta["embed_dim"] = std::to_string(E);
  return t;
}

// One change to the state dict, rewritten with the library's writer (F32).
bool mutate_weights(InputParts& parts, Rng& rng) {
  std::map<std::string, Tensor<float>> tensors;
  std::map<std::string, std::string> meta;
  try {
    const std::string& w = parts.blobs[InputParts::Weights];
    const auto f = multihead::parse_safetensors(reinterpret_cast<const uint8_t*>(w.data()), w.size(), "blob");
    meta = f.metadata;
    for (const auto& [name, t] : f.tensors) tensors.emplace(name, multihead::tensor_cast<float>(t.values));
  } catch (const multihead::Error&) {
    // Unreadable: start again from a valid one.
    tensors = new_state_dict(meta, rng);
  }
  static const std::vector<std::string> keys = {"num_heads", "batch_first", "add_zero_attn", "dropout",
                                                "embed_dim", "kdim",        "vdim",          "bias",
                                                "add_bias_kv"};
  static const std::vector<std::string> values = {"0", "1", "2", "3", "4", "8", "-1", "true", "false", "True",
                                                  "0.5", "1.0", "1.5", "nan", "inf", "1e400", "",
                                                  "9223372036854775807", "99999999999999999999"};
  static const std::vector<std::string> names = {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                                                 "v_proj_weight",  "in_proj_bias",  "out_proj.weight",
                                                 "out_proj.bias",  "bias_k",        "bias_v"};
  switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
    case 0:
      tensors = new_state_dict(meta, rng);
      break;
    case 1:
      meta[pick(rng, keys)] = pick(rng, values);
      break;
    case 2:
      if (!meta.empty()) meta.erase(any_of(meta, rng));
      break;
    case 3:
      if (!tensors.empty() && chance(rng, 0.5)) {
        tensors.erase(any_of(tensors, rng));
      } else {
        // out_proj.weight may claim any width (a 0 beside it makes it
        // legal): a width past the mutator's bound gets a small one.
        int64_t E = tensors.count("out_proj.weight") ? tensors.at("out_proj.weight").size(0) : 4;
        if (!small_enough({E}, kMaxElements)) E = 4;
        tensors[pick(rng, names)] = random_tensor({1, 1, E}, rng);
      }
      break;
    default: {
      if (tensors.empty()) return false;
      auto it = any_of(tensors, rng);
      Shape s = it->second.shape();
      if (s.empty()) return false;
      auto& d = s[between(rng, 0, s.size() - 1)];
      d = nudge_dim(d, chance(rng, 0.5));
      if (chance(rng, 0.2)) s.push_back(1);
      // A nudge can turn a 0 beside a huge dimension into a 1.
      if (!small_enough(s, kMaxElements)) return false;
      it->second = random_tensor(s, rng);
      break;
    }
  }
  try {
    parts.blobs[InputParts::Weights] = multihead::serialize_safetensors(tensors, meta);
  } catch (const multihead::Error&) {
    return false;
  }
  return true;
}

// libFuzzer's byte mutations inside one field.
void mutate_bytes(InputParts& parts, Rng& rng, std::size_t budget) {
  std::size_t which = between(rng, 0, InputParts::kBlobs);
  // Bytes of the state dict mostly break its JSON: fuzz_safetensors covers
  // that, so it gets a quarter of its share here.
  if (which == InputParts::Weights && chance(rng, 0.75))
    which = between(rng, 1, InputParts::kBlobs);
  if (which == InputParts::kBlobs) {
    uint8_t h[InputParts::kHeader];
    std::copy(parts.header.begin(), parts.header.end(), h);
    LLVMFuzzerMutate(h, sizeof h, sizeof h);
    std::copy(h, h + sizeof h, parts.header.begin());
    return;
  }
  std::string& blob = parts.blobs[which];
  if (blob.empty()) blob.push_back(static_cast<char>(rng()));  // LLVMFuzzerMutate wants a byte
  std::vector<uint8_t> buf(blob.begin(), blob.end());
  const std::size_t max = blob.size() + std::min<std::size_t>(budget, 256);
  buf.resize(max);
  const std::size_t n = LLVMFuzzerMutate(buf.data(), blob.size(), buf.size());
  blob.assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
}

bool mutate_structured(InputParts& parts, Rng& rng) {
  const std::size_t npy = between(rng, 1, InputParts::kBlobs - 1);
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0:
    case 1:
      return reshape_npy(parts, npy, rng);
    case 2:
      return plant_values(parts, npy, rng);
    case 3:
      return mutate_weights(parts, rng);
    case 4:  // options: one header byte, or a presence bit
      if (chance(rng, 0.5)) {
        parts.header[4] ^= static_cast<uint8_t>(1u << std::uniform_int_distribution<int>(0, 3)(rng));
      } else {
        parts.header[between(rng, 0, 3)] ^=
            static_cast<uint8_t>(1u << std::uniform_int_distribution<int>(0, 7)(rng));
      }
      return true;
    default: {  // a fresh tensor for a missing or unreadable blob
      if (parse(parts.blobs[npy])) return reshape_npy(parts, npy, rng);
      Shape s(between(rng, 1, 3));
      for (auto& d : s) d = interesting_dim(rng, false);
      const bool mask = npy >= InputParts::KeyPaddingMask && chance(rng, 0.5);
      const auto bytes = write_npy(s, {}, mask ? DType::Bool : DType::F32, rng);
      if (!bytes) return false;
      parts.blobs[npy] = *bytes;
      parts.header[4] |= static_cast<uint8_t>(npy == InputParts::Query ? 0 : 1u << (npy - InputParts::Key));
      return true;
    }
  }
}

std::size_t emit(const InputParts& parts, uint8_t* out, std::size_t max_size) {
  const std::string bytes = multihead::fuzz::join_input(parts);
  if (bytes.size() > max_size) return 0;
  std::memcpy(out, bytes.data(), bytes.size());
  return bytes.size();
}

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  Rng rng(seed);
  InputParts parts;
  if (!multihead::fuzz::split_input(data, size, parts)) return LLVMFuzzerMutate(data, size, max_size);
  const std::size_t used = multihead::fuzz::join_input(parts).size();
  const std::size_t budget = max_size > used ? max_size - used : 0;
  const bool structured = chance(rng, 0.5) && mutate_structured(parts, rng);
  if (!structured) mutate_bytes(parts, rng, budget);
  const std::size_t n = emit(parts, data, max_size);
  return n > 0 ? n : LLVMFuzzerMutate(data, size, max_size);
}

// Crossover field by field: each field from one parent or the other.
extern "C" std::size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, std::size_t size1,
                                                 const uint8_t* data2, std::size_t size2, uint8_t* out,
                                                 std::size_t max_out_size, unsigned int seed) {
  Rng rng(seed);
  InputParts a, b;
  if (!multihead::fuzz::split_input(data1, size1, a) || !multihead::fuzz::split_input(data2, size2, b))
    return 0;
  for (std::size_t i = 0; i < InputParts::kHeader; ++i)
    if (chance(rng, 0.5)) a.header[i] = b.header[i];
  for (std::size_t i = 0; i < InputParts::kBlobs; ++i)
    if (chance(rng, 0.5)) a.blobs[i] = b.blobs[i];
  return emit(a, out, max_out_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    multihead::fuzz::run_forward_input(data, size);
  } catch (const multihead::fuzz::HarnessFailure& e) {
    std::fprintf(stderr, "fuzz_forward: contract broken: %s\n", e.what());
    __builtin_trap();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_forward: unexpected %s: %s\n", typeid(e).name(), e.what());
    __builtin_trap();
  }
  return 0;
}
