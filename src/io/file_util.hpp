// src/io/file_util.hpp: a file's bytes for the format readers (mapped, or
// read from a pipe), and the errno text every I/O error message ends with.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace multihead::detail {

// The bytes of the regular file (or pipe) at `path`, for a format reader
// that checks its header before it looks at anything else. `name` starts
// every error message: "query: cannot read 'x.npy': No such file or
// directory", the wording of check_input_file. A missing file is
// Error(Missing); a directory, a device or a failed read is Error(IO).
//
// A regular file is memory-mapped (read-only, private), as the safetensors
// crate maps its files (memmap2): nothing is read until the reader touches
// it, so a 10 GB file whose header is bad costs a page, and a reader that
// decodes only its header and tensors never reads the bytes between or past
// them. The mapping has the size fstat gave when it was made. A writer that
// replaces the file by rename (as multihead's writers do: io.hpp) leaves the
// mapping intact; another program truncating the file in place while it is
// read makes the reader's next touch of the lost pages raise SIGBUS, the
// caveat every mmap reader (memmap2's `unsafe`) shares.
//
// A pipe (or a file that cannot be mapped, such as an empty /proc file)
// is read instead. It has no size to check a header against, and may never
// end (`yes |`, a stream of zeros). `expected` is the format's own answer:
// given the first bytes, the file's whole size, or nullopt while it needs
// more bytes to tell (a size below the bytes given means they are already
// bad). Such a file is read only until one byte past that size, so the
// parser can still say "trailing data", and never allocates more than its
// header claims.
using ExpectedSize = std::function<std::optional<uint64_t>(const uint8_t* data, std::size_t size)>;
class FileBytes {
 public:
  FileBytes() = default;
  FileBytes(FileBytes&& other) noexcept;
  FileBytes& operator=(FileBytes&& other) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  const uint8_t* data() const { return map_ ? static_cast<const uint8_t*>(map_) : read_.data(); }
  std::size_t size() const { return map_ ? map_size_ : read_.size(); }
  bool mapped() const { return map_ != nullptr; }

 private:
  friend FileBytes map_file(const std::string&, const std::string&, const ExpectedSize&);
  void* map_ = nullptr;  // munmap'd by the destructor
  std::size_t map_size_ = 0;
  std::vector<uint8_t> read_;
};
FileBytes map_file(const std::string& path, const std::string& name, const ExpectedSize& expected = {});
// A safetensors file, read (a pipe) only as far as its header says it
// reaches (src/io/safetensors.cpp).
FileBytes map_safetensors(const std::string& path, const std::string& name);

// Why a file of this st_mode cannot be an input ("is a directory"), or ""
// when it can: regular files and pipes (a shell's <(...)) are read, devices
// are not, since /dev/zero would never end. map_file and check_input_file
// share it, so the early check and the read itself agree.
std::string input_refusal(unsigned mode);

// The folder part of a path: "a/b" -> "a", "b" -> ".", "/b" -> "/".
std::string folder_of(const std::string& path);

// strerror(err), without strerror's shared static buffer.
std::string errno_text(int err);

}  // namespace multihead::detail
