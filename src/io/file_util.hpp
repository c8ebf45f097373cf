// src/io/file_util.hpp: whole-file reads for the format readers, and the
// errno text every I/O error message ends with.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace multihead::detail {

// The bytes of the regular file (or pipe) at `path`. `name` starts every
// error message: "query: cannot read 'x.npy': No such file or directory",
// the wording of check_input_file. A missing file is Error(Missing); a
// directory, a device or a failed read is Error(IO).
//
// A pipe has no size to check a header against, and may never end (`yes |`,
// a stream of zeros). `expected` is the format's own answer: given the first
// bytes, the file's whole size, or nullopt while it needs more bytes to tell
// (a size below the bytes given means they are already bad). A pipe is read
// only until one byte past that size, so the parser can still say
// "trailing data", and never allocates more than its header claims.
using ExpectedSize = std::function<std::optional<uint64_t>(const uint8_t* data, std::size_t size)>;
std::vector<uint8_t> read_file(const std::string& path, const std::string& name, const ExpectedSize& expected = {});

// Why a file of this st_mode cannot be an input ("is a directory"), or ""
// when it can: regular files and pipes (a shell's <(...)) are read, devices
// are not, since /dev/zero would never end. read_file and check_input_file
// share it, so the early check and the read itself agree.
std::string input_refusal(unsigned mode);

// The folder part of a path: "a/b" -> "a", "b" -> ".", "/b" -> "/".
std::string folder_of(const std::string& path);

// strerror(err), without strerror's shared static buffer.
std::string errno_text(int err);

}  // namespace multihead::detail
