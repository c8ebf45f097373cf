// src/io/file_util.hpp: whole-file reads for the format readers, and the
// errno text every I/O error message ends with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace multihead::detail {

// The bytes of the regular file (or pipe) at `path`. `name` starts every
// error message: "query: cannot open 'x.npy': No such file or directory".
// A missing file is Error(Missing); a directory, a device or a failed read
// is Error(IO).
std::vector<uint8_t> read_file(const std::string& path, const std::string& name);

// strerror(err), without strerror's shared static buffer.
std::string errno_text(int err);

}  // namespace multihead::detail
