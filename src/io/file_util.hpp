// src/io/file_util.hpp: whole-file reads for the format readers, and the
// errno text every I/O error message ends with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace multihead::detail {

// The bytes of the regular file (or pipe) at `path`. `name` starts every
// error message: "query: cannot read 'x.npy': No such file or directory",
// the wording of check_input_file. A missing file is Error(Missing); a
// directory, a device or a failed read is Error(IO).
std::vector<uint8_t> read_file(const std::string& path, const std::string& name);

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
