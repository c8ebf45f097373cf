// src/io/safetensors.cpp: reading the safetensors format
// (https://github.com/huggingface/safetensors, "Format" in its README):
//   8 bytes  N, the header length, uint64 little-endian
//   N bytes  JSON object {name: {"dtype", "shape", "data_offsets"}, …,
//            optional "__metadata__": {string: string}}
//   rest     the data buffer; data_offsets are [begin, end) within it.
// Every rule the Rust crate enforces that guards memory is enforced here,
// each with a message naming the file, the tensor and both numbers.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "io/bytes.hpp"
#include "io/decode.hpp"
#include "io/file_util.hpp"
#include "io/message.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {

namespace {

using nlohmann::json;

// The Rust crate's MAX_HEADER_SIZE: beyond this a header is hostile, not big.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The dtypes of the format's original specification, in its order: every
// dtype a PyTorch state_dict of floats, bools and integers is written in.
// The F8 variants (F8_E4M3, F8_E5M2, …) and the sub-byte types came later;
// each would need its own decoder, so until a checkpoint needs one they are
// refused with the list below.
struct StDType {
  std::string_view name;
  DType dtype;
};
constexpr StDType kStDTypes[] = {
    {"BOOL", DType::Bool}, {"U8", DType::U8},   {"I8", DType::I8},     {"U16", DType::U16}, {"I16", DType::I16},
    {"U32", DType::U32},   {"I32", DType::I32}, {"U64", DType::U64},   {"I64", DType::I64}, {"F16", DType::F16},
    {"BF16", DType::BF16}, {"F32", DType::F32}, {"F64", DType::F64},
};

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw Error(Error::Kind::Format, name + ": " + what);
}

// One tensor's header entry, validated against the buffer.
struct Entry {
  std::string key;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

std::string offsets_text(uint64_t begin, uint64_t end) {
  // Built by appending: GCC 12 -O3 misreports "lit" + std::string&& under
  // -Wrestrict (GCC bug 105329).
  std::string out = "[";
  out += std::to_string(begin);
  out += ", ";
  out += std::to_string(end);
  out += "]";
  return out;
}

// The deepest nesting of [ and { in a JSON text (outside its strings). A
// safetensors header nests three deep (the header, an entry, its shape);
// nlohmann::json's printing and comparison recurse, so a header nested
// 100,000 deep overflowed the stack (SIGSEGV) where a message quoted it.
constexpr int kMaxJsonDepth = 16;
bool nested_too_deep(const char* begin, const char* end) {
  int depth = 0;
  bool in_string = false;
  for (const char* c = begin; c != end; ++c) {
    if (in_string) {
      if (*c == '\\' && c + 1 != end) ++c;
      else if (*c == '"') in_string = false;
    } else if (*c == '"') {
      in_string = true;
    } else if (*c == '[' || *c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (*c == ']' || *c == '}') {
      --depth;
    }
  }
  return false;
}

// nlohmann::json silently keeps the last of two equal keys, which would let
// a file say two things about one tensor. The parser callback sees every key
// of every object as it is read, so it can report the first repeat.
json parse_header_json(const char* begin, const char* end, const std::string& name) {
  std::vector<std::set<std::string>> open_objects;
  std::string repeated;
  bool has_repeat = false;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end: open_objects.pop_back(); break;
      case json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second && !has_repeat) {
          has_repeat = true;
          repeated = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  if (nested_too_deep(begin, end))
    fail(name, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                   " levels, expected an object of tensor entries (3 levels)");
  json root;
  try {
    root = json::parse(begin, end, on_event);
  } catch (const json::exception& e) {
    fail(name, "header is not valid JSON: " + detail::printable(e.what(), 300));
  }
  if (has_repeat) fail(name, "header JSON has the key " + quote_input(repeated, 120) + " twice");
  if (!root.is_object())
    fail(name, std::string("header JSON is ") + root.type_name() + ", expected an object");
  return root;
}

std::map<std::string, std::string> read_metadata(const json& meta, const std::string& name) {
  if (!meta.is_object())
    fail(name, std::string("__metadata__ is ") + meta.type_name() + ", expected an object");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      fail(name,
           "__metadata__ " + quote_input(key, 120) + " is " + value.type_name() + ", expected a string");
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

// A JSON number that is a valid size: a non-negative integer below 2^63
// (shapes) or 2^64 (offsets). nlohmann stores 1.0 or 1e3 as floats.
bool as_count(const json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return *out <= max;
}

std::string read_dtype_name(const json& v, const std::string& t) {
  const auto dtype = v.find("dtype");
  if (dtype == v.end()) fail(t, "missing 'dtype'");
  if (!dtype->is_string()) fail(t, std::string("'dtype' is ") + dtype->type_name() + ", expected a string");
  return dtype->get<std::string>();
}

// The one list of accepted dtypes is kStDTypes; the message is made from it.
DType find_dtype(const std::string& dtype_name, const std::string& t) {
  for (const StDType& d : kStDTypes)
    if (d.name == dtype_name) return d.dtype;
  std::string accepted;
  for (const StDType& d : kStDTypes) accepted += (accepted.empty() ? "" : ", ") + std::string(d.name);
  fail(t, "dtype " + detail::printable(dtype_name) + " is not supported (accepted: " + accepted + ")");
}

Entry read_entry(const std::string& key, const json& v, uint64_t buffer_size, const std::string& name) {
  const std::string t = name + ": tensor " + quote_input(key, 120);
  if (!v.is_object()) fail(t, std::string("entry is ") + v.type_name() + ", expected an object");
  for (const auto& item : v.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      fail(t, "unknown key " + quote_input(item.key(), 120) + " (accepted: dtype, shape, data_offsets)");
    }
  }
  Entry e{key, DType::F32, {}, 0, 0};

  const std::string dtype_name = read_dtype_name(v, t);
  e.dtype = find_dtype(dtype_name, t);

  const auto shape = v.find("shape");
  if (shape == v.end()) fail(t, "missing 'shape'");
  if (!shape->is_array()) fail(t, std::string("'shape' is ") + shape->type_name() + ", expected an array");
  if (shape->size() > kMaxDims)
    fail(t, "'shape' has " + std::to_string(shape->size()) + " dimensions, expected at most " +
                std::to_string(kMaxDims) + " (NumPy's limit)");
  for (std::size_t i = 0; i < shape->size(); ++i) {
    uint64_t d = 0;
    if (!as_count((*shape)[i], INT64_MAX, &d)) {
      fail(t, "shape[" + std::to_string(i) + "] is " + detail::printable((*shape)[i].dump(), 40) +
                  ", expected an integer in [0, 2^63)");
    }
    e.shape.push_back(static_cast<int64_t>(d));
  }
  int64_t numel = 0;
  try {
    numel = shape_numel(e.shape);
  } catch (const Error& err) {
    fail(t, err.what());
  }

  const auto offsets = v.find("data_offsets");
  if (offsets == v.end()) fail(t, "missing 'data_offsets'");
  if (!offsets->is_array() || offsets->size() != 2 || !as_count((*offsets)[0], UINT64_MAX, &e.begin) ||
      !as_count((*offsets)[1], UINT64_MAX, &e.end)) {
    fail(t,
         "'data_offsets' is " + detail::printable(offsets->dump(), 60) + ", expected [begin, end] integers");
  }
  if (e.begin > e.end) fail(t, "data_offsets " + offsets_text(e.begin, e.end) + " has begin after end");
  if (e.end > buffer_size) {
    fail(t, "data_offsets " + offsets_text(e.begin, e.end) + " end past the " + std::to_string(buffer_size) +
                "-byte data buffer");
  }
  uint64_t need = 0;
  const bool overflow =
      __builtin_mul_overflow(static_cast<uint64_t>(numel), detail::itemsize(e.dtype), &need);
  if (overflow || need != e.end - e.begin) {
    fail(t, "shape " + shape_to_string(e.shape) + " " + dtype_name + " needs " +
                (overflow ? "more than 2^64" : std::to_string(need)) + " bytes, data_offsets " +
                offsets_text(e.begin, e.end) + " span " + std::to_string(e.end - e.begin));
  }
  return e;
}

// Two tensors sharing bytes would alias. After sorting by begin, any overlap
// shows up between neighbours. Empty tensors hold no bytes and are skipped.
// (The Rust crate also rejects gaps between tensors; a gap is harmless to
// us, since its bytes are never read, so we accept it. Bytes past the last
// tensor are refused: check_no_trailing_data.)
void check_no_overlap(std::vector<const Entry*> entries, const std::string& name) {
  std::erase_if(entries, [](const Entry* e) { return e->begin == e->end; });
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (std::size_t i = 1; i < entries.size(); ++i) {
    const Entry& a = *entries[i - 1];
    const Entry& b = *entries[i];
    if (a.end > b.begin) {
      fail(name, "tensors " + quote_input(a.key, 120) + " (data_offsets " + offsets_text(a.begin, a.end) +
                     ") and " + quote_input(b.key, 120) + " (data_offsets " +
                     offsets_text(b.begin, b.end) + ") overlap");
    }
  }
}

// The data buffer ends where the last tensor ends. The Rust crate refuses
// any other size (SafeTensors::read_metadata: `buffer_end + 8 + n !=
// buffer_len` is MetadataIncompleteBuffer, "The last offset **must** be the
// end of the file"), and so do we: bytes past the last tensor are a file
// cut short or padded by something that is not a safetensors writer, and a
// size that disagrees with the header is refused, as the .npy reader
// refuses trailing data. The bytes are never read (the file is mapped),
// so a 10 GB tail costs no memory and no time.
void check_no_trailing_data(const std::vector<Entry>& entries, uint64_t buffer_size, const std::string& name) {
  uint64_t end = 0;
  for (const Entry& e : entries) end = std::max(end, e.end);
  if (end != buffer_size) {
    fail(name, "trailing data: the tensors end at byte " + std::to_string(end) + " of the " +
                   std::to_string(buffer_size) + "-byte data buffer (the format ends the file at the last tensor)");
  }
}

// A file of another known format gets named instead of failing on a header
// length made of its magic bytes.
void reject_other_formats(const uint8_t* data, std::size_t size, const std::string& name) {
  const FileFormat format = detect_file_format(data, size);
  if (format == FileFormat::Safetensors || format == FileFormat::Unknown) return;
  const bool torch = format == FileFormat::TorchZip || format == FileFormat::TorchPickle;
  fail(name, "this is " + describe(format) + ", not a safetensors file" +
                 (torch ? " (save its state_dict as safetensors: README.md, 'Coming from PyTorch')" : ""));
}

// A validated entry into the map for its kind of dtype (io.hpp): integer
// tensors are described, the others decoded.
// With Sixteen::Keep a BF16 or F16 tensor keeps its bits (io.hpp).
template <class E>
Tensor<E> copy_sixteen(const Entry& e, const uint8_t* buffer) {
  Tensor<E> t(e.shape);
  const uint8_t* src = buffer + e.begin;
  for (int64_t i = 0; i < t.numel(); ++i) t[i].bits = detail::load_le<uint16_t>(src + 2 * i);
  return t;
}

void add_tensor(const Entry& e, const uint8_t* buffer, uint64_t buffer_offset, Sixteen sixteen,
                const TensorWanted& wanted, SafetensorsFile& out) {
  if (is_integer(e.dtype)) {
    out.integer_tensors.emplace(e.key, IntegerTensorInfo{e.dtype, e.shape, e.end - e.begin});
    return;
  }
  if (wanted && !wanted(e.key)) {
    out.undecoded.emplace(e.key, SafetensorsEntry{e.dtype, e.shape, buffer_offset + e.begin});
    return;
  }
  if (sixteen == Sixteen::Keep && e.dtype == DType::BF16) {
    out.bf16_tensors.emplace(e.key, copy_sixteen<bfloat16>(e, buffer));
    return;
  }
  if (sixteen == Sixteen::Keep && e.dtype == DType::F16) {
    out.f16_tensors.emplace(e.key, copy_sixteen<float16>(e, buffer));
    return;
  }
  Storage<double> values(static_cast<std::size_t>(shape_numel(e.shape)));
  detail::decode_to_double(buffer + e.begin, values.size(), e.dtype, /*big_endian=*/false, values.data());
  out.tensors.emplace(e.key, LoadedTensor{e.dtype, Tensor<double>(e.shape, std::move(values))});
}

}  // namespace

namespace {

// The header's checks (parse_safetensors_header) and its entries, with
// where the data buffer begins.
struct ParsedHeader {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
  uint64_t buffer_offset = 0;
};

ParsedHeader parse_header(const uint8_t* data, std::size_t size, const std::string& name) {
  reject_other_formats(data, size, name);
  if (size < 8)
    fail(name, "file has " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  const uint64_t header_len = detail::load_le<uint64_t>(data);
  // The limit first: past it the length is refused whatever follows (a pipe
  // is read only as far as the limit, so its "bytes after" say nothing).
  if (header_len > kMaxHeaderBytes) {
    fail(name, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_len > size - 8) {
    fail(name, "header length " + std::to_string(header_len) + " exceeds the " + std::to_string(size - 8) +
                   " bytes after it");
  }
  const char* header = reinterpret_cast<const char*>(data) + 8;
  const json root = parse_header_json(header, header + header_len, name);
  const uint64_t buffer_size = size - 8 - header_len;

  ParsedHeader out;
  out.buffer_offset = 8 + header_len;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      out.metadata = read_metadata(value, name);
    } else {
      out.entries.push_back(read_entry(key, value, buffer_size, name));
    }
  }
  std::vector<const Entry*> pointers;
  for (const Entry& e : out.entries) pointers.push_back(&e);
  check_no_overlap(std::move(pointers), name);
  check_no_trailing_data(out.entries, buffer_size, name);
  return out;
}

}  // namespace

SafetensorsFile parse_safetensors(const uint8_t* data, std::size_t size, const std::string& name,
                                  Sixteen sixteen, const TensorWanted& wanted) {
  ParsedHeader h = parse_header(data, size, name);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) add_tensor(e, data + h.buffer_offset, h.buffer_offset, sixteen, wanted, out);
  return out;
}

TensorWanted tensors_under(const std::string& prefix) {
  if (prefix.empty()) return {};
  return [prefix](const std::string& name) { return name.starts_with(prefix); };
}

TensorWanted tensors_named(const std::string& prefix, std::set<std::string> local_names) {
  return [prefix, names = std::move(local_names)](const std::string& name) {
    return name.starts_with(prefix) && names.count(name.substr(prefix.size())) != 0;
  };
}

std::string module_prefix(const std::string& prefix) {
  return prefix.empty() || prefix.back() == '.' ? prefix : prefix + ".";
}

TensorWanted no_tensors() {
  return [](const std::string&) { return false; };
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, std::size_t size, const std::string& name) {
  ParsedHeader h = parse_header(data, size, name);
  SafetensorsHeader out;
  out.metadata = std::move(h.metadata);
  for (Entry& e : h.entries) out.tensors.emplace(e.key, SafetensorsEntry{e.dtype, std::move(e.shape), h.buffer_offset + e.begin});
  return out;
}

namespace {

// A safetensors file's whole size from its first bytes (detail::ExpectedSize):
// the header's length, then the furthest data_offsets end; 0 when the bytes
// are already bad, so the read stops and parse_safetensors says why.
std::optional<uint64_t> safetensors_size(const uint8_t* data, std::size_t size) {
  if (size < 8) return std::nullopt;
  const uint64_t header_len = detail::load_le<uint64_t>(data);
  if (header_len > kMaxHeaderBytes) return 0;
  if (size < 8 + header_len) return std::nullopt;
  const char* header = reinterpret_cast<const char*>(data) + 8;
  if (nested_too_deep(header, header + header_len)) return 0;
  const json root = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return 0;
  uint64_t end = 0;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") continue;
    const auto offsets = value.is_object() ? value.find("data_offsets") : value.end();
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[1].is_number_unsigned())
      return 0;
    end = std::max(end, (*offsets)[1].get<uint64_t>());
  }
  uint64_t total = 0;
  if (__builtin_add_overflow(end, 8 + header_len, &total)) return 0;
  return total;
}

}  // namespace

namespace detail {
FileBytes map_safetensors(const std::string& path, const std::string& name) {
  return map_file(path, name, safetensors_size);
}
}  // namespace detail

SafetensorsFile read_safetensors(const std::string& path, Sixteen sixteen, const TensorWanted& wanted) {
  const detail::FileBytes bytes = detail::map_safetensors(path, path);
  return parse_safetensors(bytes.data(), bytes.size(), path, sixteen, wanted);
}

}  // namespace multihead
