// src/io/npy.cpp: NumPy .npy read and write (NEP 1; numpy/lib/format.py).
// Layout: magic "\x93NUMPY", version byte pair, header length (uint16 LE for
// 1.0, uint32 LE for 2.0 and 3.0), the header dict literal, then the raw
// elements in C or Fortran order.
#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.hpp"
#include "io/bytes.hpp"
#include "io/decode.hpp"
#include "io/file_util.hpp"
#include "io/message.hpp"
#include "io/npy_header.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {

namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw Error(Error::Kind::Format, name + ": " + what);
}

struct NpyDType {
  std::string_view descr;
  DType dtype;
  bool big_endian;
  const char* display;  // what messages call it; '|u1' is not a bool on disk
};

// '|' means byte order is irrelevant (one-byte items). NumPy writes '<'/'>'
// for multi-byte items, never '=' (it resolves native order on save).
constexpr NpyDType kNpyDTypes[] = {
    {"|b1", DType::Bool, false, "bool"},   {"|u1", DType::Bool, false, "uint8"},
    {"<f2", DType::F16, false, "float16"}, {">f2", DType::F16, true, "float16"},
    {"<f4", DType::F32, false, "float32"}, {">f4", DType::F32, true, "float32"},
    {"<f8", DType::F64, false, "float64"}, {">f8", DType::F64, true, "float64"},
};

const NpyDType& find_dtype(const std::string& descr, const std::string& name) {
  for (const NpyDType& t : kNpyDTypes) {
    if (t.descr == descr) return t;
  }
  std::string accepted;
  for (const NpyDType& t : kNpyDTypes)
    accepted += std::string(accepted.empty() ? "" : ", ") + "'" + std::string(t.descr) + "'";
  throw Error(Error::Kind::Format,
              name + ": unsupported dtype " + quote_input(descr, 120) + " (accepted: " + accepted + ")");
}

// `src` holds the elements in Fortran order (first index fastest); returns
// them in C order. Walks the C-order index like an odometer and keeps the
// matching Fortran offset up to date.
Storage<double> fortran_to_c(const Storage<double>& src, const Shape& shape) {
  const std::size_t rank = shape.size();
  std::vector<int64_t> fstride(rank), idx(rank, 0);
  int64_t s = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    fstride[k] = s;
    s *= shape[k];
  }
  Storage<double> out(src.size());
  int64_t off = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = src[static_cast<std::size_t>(off)];
    for (std::size_t k = rank; k-- > 0;) {
      off += fstride[k];
      if (++idx[k] < shape[k]) break;
      off -= fstride[k] * shape[k];
      idx[k] = 0;
    }
  }
  return out;
}

}  // namespace

LoadedTensor parse_npy(const uint8_t* data, std::size_t size, const std::string& name) {
  if (size == 0 || std::memcmp(data, kMagic, std::min(size, sizeof kMagic)) != 0) {
    const FileFormat format = detect_file_format(data, size);
    if (format != FileFormat::Unknown) fail(name, "this is " + describe(format) + ", not a .npy array");
    fail(name, "not a .npy file: it does not start with the magic bytes \\x93NUMPY");
  }
  if (size < 8)
    fail(name, "truncated: file has " + std::to_string(size) + " bytes, the .npy preamble needs at least 10");
  const int major = data[6], minor = data[7];
  if (major < 1 || major > 3 || minor != 0) {
    fail(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (accepted: 1.0, 2.0, 3.0)");
  }
  const std::size_t preamble = major == 1 ? 10 : 12;
  if (size < preamble) {
    fail(name, "truncated: file has " + std::to_string(size) + " bytes, the version " +
                   std::to_string(major) + ".0 preamble needs " + std::to_string(preamble));
  }
  const uint64_t header_len =
      major == 1 ? detail::load_le<uint16_t>(data + 8) : detail::load_le<uint32_t>(data + 8);
  if (header_len > size - preamble) {
    fail(name, "truncated header: header length says " + std::to_string(header_len) + " bytes, file has " +
                   std::to_string(size - preamble) + " after the preamble");
  }
  const detail::NpyHeader header = detail::parse_npy_header(
      std::string_view(reinterpret_cast<const char*>(data) + preamble, header_len), name);
  const NpyDType& type = find_dtype(header.descr, name);

  int64_t numel = 0;
  try {
    numel = shape_numel(header.shape);
  } catch (const Error& e) {
    fail(name, std::string("header ") + e.what());
  }
  // Compare sizes before allocating anything: a header may claim 2^60
  // elements in a 100-byte file.
  const std::size_t item = detail::itemsize(type.dtype);
  const std::size_t have = size - preamble - header_len;
  uint64_t need = 0;
  const bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(numel), item, &need);
  if (overflow || need != have) {
    fail(name, std::string(overflow || need > have ? "truncated data" : "trailing data") +
                   ": header says shape " + shape_to_string(header.shape) + " " + type.display + " = " +
                   (overflow ? "more than 2^64" : std::to_string(need)) + " bytes, file has " +
                   std::to_string(have));
  }

  const uint8_t* elements = data + preamble + header_len;
  detail::check_fits_in_memory(name, "shape " + shape_to_string(header.shape) + " as float64",
                               8.0 * static_cast<double>(numel), "");
  Storage<double> values(static_cast<std::size_t>(numel));
  detail::decode_to_double(elements, values.size(), type.dtype, type.big_endian, values.data());
  if (header.fortran_order && header.shape.size() > 1) values = fortran_to_c(values, header.shape);
  return LoadedTensor{type.dtype, Tensor<double>(header.shape, std::move(values))};
}

namespace {

// A .npy file's whole size from its first bytes (detail::ExpectedSize), for
// reading a pipe no further than its header claims; 0 when the bytes are
// already bad, so the read stops and parse_npy says why.
std::optional<uint64_t> npy_size(const uint8_t* data, std::size_t size) {
  const std::size_t magic = std::min(size, sizeof kMagic);
  if (magic > 0 && std::memcmp(data, kMagic, magic) != 0) return 0;
  if (size < 8) return std::nullopt;
  if (data[6] < 1 || data[6] > 3 || data[7] != 0) return 0;
  const std::size_t preamble = data[6] == 1 ? 10 : 12;
  if (size < preamble) return std::nullopt;
  const uint64_t header_len =
      preamble == 10 ? detail::load_le<uint16_t>(data + 8) : detail::load_le<uint32_t>(data + 8);
  if (size < preamble + header_len) return std::nullopt;
  try {
    const detail::NpyHeader header = detail::parse_npy_header(
        std::string_view(reinterpret_cast<const char*>(data) + preamble, header_len), "");
    uint64_t bytes = 0, total = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(shape_numel(header.shape)),
                               detail::itemsize(find_dtype(header.descr, "").dtype), &bytes) ||
        __builtin_add_overflow(bytes, preamble + header_len, &total))
      return 0;
    return total;
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace

LoadedTensor read_npy(const std::string& path, const std::string& name) {
  const detail::FileBytes bytes = detail::map_file(path, name, npy_size);
  return parse_npy(bytes.data(), bytes.size(), name + " (" + path + ")");
}

// ---- writing ------------------------------------------------------------------

namespace {

template <class T>
constexpr const char* npy_descr();
template <>
constexpr const char* npy_descr<float>() {
  return "<f4";
}
template <>
constexpr const char* npy_descr<double>() {
  return "<f8";
}
template <>
constexpr const char* npy_descr<uint8_t>() {
  return "|b1";
}

// Python's repr of a tuple: "()", "(5,)", "(2, 3)".
std::string python_tuple(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

template <class T>
void append_elements(std::string& out, const Tensor<T>& t) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    // '|b1' holds 0 or 1; a mask byte may be any nonzero value.
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t[i] != 0 ? 1 : 0);
  } else if constexpr (std::endian::native == std::endian::little) {
    out.append(reinterpret_cast<const char*>(t.data()), static_cast<std::size_t>(t.numel()) * sizeof(T));
  } else {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    for (int64_t i = 0; i < t.numel(); ++i) detail::append_le(out, std::bit_cast<U>(t[i]));
  }
}

}  // namespace

template <class T>
std::string serialize_npy(const Tensor<T>& tensor) {
  if (shape_numel(tensor.shape()) != tensor.numel()) {
    throw Error(Error::Kind::Shape, "serialize_npy: shape " + shape_to_string(tensor.shape()) + " needs " +
                                        std::to_string(shape_numel(tensor.shape())) +
                                        " elements, tensor has " + std::to_string(tensor.numel()));
  }
  // Byte for byte what numpy.save writes (format.py, _write_array_header):
  // sorted keys, then spare spaces so the first dimension can grow to 21
  // digits in place, then padding so the data starts on a 64-byte boundary.
  std::string dict = std::string("{'descr': '") + npy_descr<T>() +
                     "', 'fortran_order': False, 'shape': " + python_tuple(tensor.shape()) + ", }";
  if (!tensor.shape().empty()) dict.append(21 - std::to_string(tensor.shape()[0]).size(), ' ');
  const std::size_t hlen = dict.size() + 1;  // + '\n'
  std::size_t len_bytes = 2;
  std::size_t pad = 64 - (8 + len_bytes + hlen) % 64;
  if (hlen + pad > 0xffff) {  // does not fit version 1.0's uint16 length
    len_bytes = 4;
    pad = 64 - (8 + len_bytes + hlen) % 64;
  }

  std::string out(reinterpret_cast<const char*>(kMagic), sizeof kMagic);
  out.push_back(static_cast<char>(len_bytes == 2 ? 1 : 2));
  out.push_back(0);
  if (len_bytes == 2) {
    detail::append_le(out, static_cast<uint16_t>(hlen + pad));
  } else {
    detail::append_le(out, static_cast<uint32_t>(hlen + pad));
  }
  out += dict;
  out.append(pad, ' ');
  out.push_back('\n');
  out.reserve(out.size() + static_cast<std::size_t>(tensor.numel()) * sizeof(T));
  append_elements(out, tensor);
  return out;
}

template <class T>
void write_npy(const std::string& path, const Tensor<T>& tensor) {
  write_file_atomic(path, serialize_npy(tensor));
}

template std::string serialize_npy(const Tensor<float>&);
template std::string serialize_npy(const Tensor<double>&);
template std::string serialize_npy(const Tensor<uint8_t>&);
template void write_npy(const std::string&, const Tensor<float>&);
template void write_npy(const std::string&, const Tensor<double>&);
template void write_npy(const std::string&, const Tensor<uint8_t>&);

}  // namespace multihead
