// multihead/io.hpp: the ecosystem's own file formats.
//  - NumPy .npy (format versions 1.0, 2.0, 3.0) for inputs and outputs.
//  - safetensors for weights, under PyTorch's state_dict key names.
//
// Both readers treat the file as hostile: every size in a header is checked
// against the file's actual size before anything is allocated, shapes whose
// product overflows are rejected, and every failure is a multihead::Error with
// one line naming the file (and tensor) and the expected and actual values.
// A regular file is memory-mapped, not read whole: its header is checked
// first, and only the tensors are then read, so a bad header costs no time
// and no memory however large the file (a pipe is read only as far as its
// header says).
// Writers are atomic: they write a temporary file in the destination folder
// and rename it over the target, so a failed run never leaves a partial file
// and never clobbers the previous one. A symlink is written through (its
// target is replaced, the link stays), a character device such as /dev/null
// is written into, and a directory, FIFO, socket or block device is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "multihead/tensor.hpp"

namespace multihead {

// The element types a file may hold. Bool and the floating-point types are
// decoded to double, which holds each of their values exactly. The integer
// types (safetensors only) are described but never decoded: int64 and
// uint64 do not fit a double exactly, and a checkpoint's integer tensors
// (BatchNorm's num_batches_tracked, BERT's position_ids) are buffers that
// no MultiheadAttention parameter can be.
enum class DType { Bool, F16, BF16, F32, F64, U8, I8, U16, I16, U32, I32, U64, I64 };
// NumPy's names: "bool", "float16", "bfloat16", "float32", "float64",
// "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64".
std::string to_string(DType dtype);

// Whether `address` lies in an input file this process has mapped to read
// it (read_npy, read_safetensors: a regular file is memory-mapped, its pages
// read on first touch), for a host's SIGBUS handler: another program that
// truncates such a file in place while it is read makes the next touch of a
// lost page raise SIGBUS (si_addr in the mapping), the caveat every mmap
// reader shares. Async-signal-safe (it reads a fixed table of atomics); at
// most 64 mappings at once are recorded. The command line turns such a
// SIGBUS into a one-line error (tools/interrupts.hpp).
bool address_in_mapped_input(const void* address) noexcept;
// U8 … I64; not Bool, which is decoded.
bool is_integer(DType dtype);

// A tensor read from a file, converted to double (exact for every decoded
// DType), with the dtype it had on disk. Bool elements become 0.0 / 1.0.
struct LoadedTensor {
  DType dtype = DType::F64;
  Tensor<double> values;
};

// ---- .npy -------------------------------------------------------------------
// Accepts dtypes '|b1' (bool), '<f4'/'>f4', '<f8'/'>f8', '<f2'/'>f2', '|u1'
// (uint8, read as bool mask values) and fortran_order True or False. `name`
// is what error messages call the array (e.g. "query").
LoadedTensor parse_npy(const uint8_t* data, std::size_t size, const std::string& name);
LoadedTensor read_npy(const std::string& path, const std::string& name);

// Writes '<f4' for float, '<f8' for double, '|b1' for uint8. Atomic.
template <class T>
void write_npy(const std::string& path, const Tensor<T>& tensor);
// The bytes write_npy would write.
template <class T>
std::string serialize_npy(const Tensor<T>& tensor);

// ---- safetensors --------------------------------------------------------------
// Layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, …,
//  "__metadata__": {"key": "value", …}}, then the data buffer. Offsets are
// relative to the buffer; tensors must lie inside it, must not overlap, and
// must have exactly numel × itemsize bytes. The buffer ends where the last
// tensor ends: bytes past it are an error ("trailing data"), as in the
// safetensors crate (MetadataIncompleteBuffer). Gaps between tensors, which
// the crate refuses too, are accepted and skipped.
//
// Every dtype of the format is accepted: BOOL, U8, I8, U16, I16, U32, I32,
// U64, I64, F16, BF16, F32, F64 (others, such as F8_E4M3, are an error that
// lists these). Every tensor is validated by the rules above, whatever its
// dtype; then it goes to one map, so each name is in exactly one:
//  - `tensors`: BOOL, F16, BF16, F32, F64, decoded to double (exact);
//  - `integer_tensors`: U8 … I64, described and not decoded. Decoding would
//    be lossy (int64 to double) and, for a whole model's file, spend memory
//    on buffers that multihead has no use for;
//  - `bf16_tensors`, `f16_tensors` (Sixteen::Keep) and `undecoded` (a
//    `wanted` filter), below.
struct IntegerTensorInfo {
  DType dtype = DType::I64;
  Shape shape;
  uint64_t byte_size = 0;  // numel × itemsize: what its data_offsets span
};

//
// A safetensors entry as its header describes it: dtype, shape, and
// `offset`, where the tensor's bytes begin, from the start of the file.
struct SafetensorsEntry {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;
};

//
// With Sixteen::Keep, BF16 and F16 tensors are not decoded: each is copied
// as stored (its bits, 2 bytes an element) into `bf16_tensors` or
// `f16_tensors` instead of `tensors`, so a 16-bit checkpoint read for a
// 16-bit module costs its own size once, not 4x that as double (the
// narrow load_weights, multihead/weights.hpp). Each name is still in
// exactly one map.
//
// With a `wanted` filter, a real-valued tensor it returns false for is not
// decoded and its bytes are not read (read_safetensors maps a regular file,
// and those pages are never touched): it goes to `undecoded`, described by
// its entry. So a loader that needs one module of a large file (load_weights
// with a prefix, inspect, find_attention_modules) costs that module, not the
// file as double. Every check of the header is made for every tensor either
// way.
struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, LoadedTensor> tensors;
  std::map<std::string, IntegerTensorInfo> integer_tensors;
  std::map<std::string, Tensor<bfloat16>> bf16_tensors;  // Sixteen::Keep only
  std::map<std::string, Tensor<float16>> f16_tensors;    // Sixteen::Keep only
  std::map<std::string, SafetensorsEntry> undecoded;     // left out by `wanted`
};
enum class Sixteen { Decode, Keep };
// Which real-valued tensors to decode, by name; empty: all of them.
using TensorWanted = std::function<bool(const std::string& name)>;

// `name` is what error messages call the file (e.g. its path).
SafetensorsFile parse_safetensors(const uint8_t* data, std::size_t size, const std::string& name,
                                  Sixteen sixteen = Sixteen::Decode, const TensorWanted& wanted = {});

// A safetensors header alone, with every check parse_safetensors makes (the
// header's size, nesting and keys, each entry's dtype, shape and offsets
// against the file, no overlap, no trailing data) and nothing decoded: for a
// reader that decodes only its part of a file (a head-parallel rank).
struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafetensorsEntry> tensors;  // floating point and integer
};
SafetensorsHeader parse_safetensors_header(const uint8_t* data, std::size_t size, const std::string& name);
SafetensorsFile read_safetensors(const std::string& path, Sixteen sixteen = Sixteen::Decode,
                                 const TensorWanted& wanted = {});
// The wanted filter of every name that starts with `prefix` (every name
// for "").
TensorWanted tensors_under(const std::string& prefix);
// The wanted filter of one module's tensors: prefix + one of `local_names`
// exactly, so neither a module nested under the prefix ("a." holding
// "a.b.in_proj_weight") nor a sibling that shares its start ("layers.1"
// and "layers.10.") is decoded.
TensorWanted tensors_named(const std::string& prefix, std::set<std::string> local_names);
// A module's prefix as every loader reads it: "" or ending in '.', which is
// added when missing ("model.layers.0.self_attn" is
// "model.layers.0.self_attn.").
std::string module_prefix(const std::string& prefix);
// The filter that decodes no tensor: for a reader of names, shapes and
// metadata only (inspect, find_attention_modules).
TensorWanted no_tensors();

// Writes every tensor as F32, keys sorted, metadata as given. Atomic.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor<float>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
std::string serialize_safetensors(const std::map<std::string, Tensor<float>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
// The same with every tensor BF16 (or F16): the 16-bit values as stored, no
// float copy. read_safetensors reads them back exactly.
// (Named apart from the float one, so that serialize_safetensors({}, …)
// stays unambiguous.)
std::string serialize_safetensors_narrow(const std::map<std::string, Tensor<bfloat16>>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});
std::string serialize_safetensors_narrow(const std::map<std::string, Tensor<float16>>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

// v with 17 significant digits ("%.17g": 0.10000000000000001, 1.0000000000000001e-05,
// 2), which strtod reads back as exactly v: how multihead writes a double
// into any text it writes (metadata, JSON reports, reproduce commands).
std::string to_exact_string(double v);

// ---- what a file is ------------------------------------------------------------
// Users pass a .npy as --weights, or a torch.save checkpoint as either; each
// reader looks at the first bytes and names what it was given instead of
// reporting a nonsense header length.
enum class FileFormat {
  Npy,          // "\x93NUMPY"
  Safetensors,  // 8-byte little-endian header length that fits the file, then '{'
  TorchZip,     // "PK\x03\x04": torch.save since PyTorch 1.6 (a zip archive)
  TorchPickle,  // "\x80" then a protocol byte 2..5: legacy torch.save, or any pickle
  Unknown,
};
// Judged from the bytes alone; `size` is the whole file's.
FileFormat detect_file_format(const uint8_t* data, std::size_t size);
// The same from the file's first bytes and its size. Throws Error(Missing /
// IO) "cannot read 'PATH': REASON" if it cannot be read, or is a directory,
// a device or a FIFO (whose first bytes would be taken from its reader; the
// open does not block when nobody writes it).
FileFormat detect_file_format(const std::string& path);
// "a .npy array", "a safetensors file", "a PyTorch torch.save zip archive", …
std::string describe(FileFormat format);

// ---- files ---------------------------------------------------------------------
// Writes `bytes` to `path` atomically (temporary file in the same folder,
// fsync, rename). Throws multihead::Error(IO) naming the path on failure.
// How `path` is treated is resolve_output_file's rule, below.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Where and how write_file_atomic would write `path`, found without writing.
// Symlinks are followed to the file they name (a dangling link names the file
// to create). That file is then:
//  - Create or Replace: written to a temporary in its folder and renamed
//    over, so readers see the old bytes or the new, never a mix;
//  - Device: a character device (/dev/null, a terminal), written in place.
// Throws Error(IO) "cannot write 'PATH': REASON" when the write is refused or
// could not succeed: a directory, a FIFO (with no reader the write would
// block), a socket or a block device; a folder that does not exist or is not
// writable; a symlink loop.
struct OutputFile {
  enum class Kind { Create, Replace, Device };
  std::string target;  // `path` with symlinks followed
  Kind kind = Kind::Create;
};
OutputFile resolve_output_file(const std::string& path);

// Several files, all or nothing: every path is resolved and checked first,
// then every regular file is written to its temporary, then devices are
// written, and only then are the temporaries renamed into place. A failure
// before the renames removes the temporaries and changes no regular file.
// Two entries naming one file are refused. A non-empty `name` starts each
// error message, as read_npy's does ("--out: cannot write 'o.npy': …").
struct FileToWrite {
  std::string path;
  std::string bytes;
  std::string name;
};
void write_files_atomic(const std::vector<FileToWrite>& files);

// Throws Error "cannot read 'PATH': REASON" (kind Missing when it does not
// exist, else IO) when read_npy or read_safetensors could not read `path`:
// not there, not readable, a directory, or a device. Reads nothing, so a
// caller can check all its inputs before it starts.
void check_input_file(const std::string& path);

// True when `a` and `b` name one file: the same inode when both exist (hard
// links, symlinks, "./a" and "a"), else the same path once symlinks and
// folders are resolved.
bool same_file(const std::string& a, const std::string& b);

}  // namespace multihead
