// src/io/file_format.cpp: telling the formats apart by their first bytes, so
// that a reader handed the wrong kind of file says which kind it was.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/bytes.hpp"
#include "io/file_util.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {

namespace {

bool starts_with(const uint8_t* data, std::size_t available, const char* magic, std::size_t len) {
  return available >= len && std::memcmp(data, magic, len) == 0;
}

// safetensors has no magic bytes. Its first 8 bytes are the header length,
// so they are checked against the file size before anything else: a real
// header length can begin with 0x80 0x02, which would look like a pickle.
bool looks_like_safetensors(const uint8_t* data, std::size_t available, uint64_t file_size) {
  if (available < 9) return false;
  const uint64_t header_len = detail::load_le<uint64_t>(data);
  return header_len >= 2 && header_len <= file_size - 8 && data[8] == '{';
}

// `available` bytes of the file are at `data`; the file has `file_size`.
FileFormat detect(const uint8_t* data, std::size_t available, uint64_t file_size) {
  if (starts_with(data, available, "\x93NUMPY", 6)) return FileFormat::Npy;
  if (looks_like_safetensors(data, available, file_size)) return FileFormat::Safetensors;
  if (starts_with(data, available, "PK\x03\x04", 4)) return FileFormat::TorchZip;
  if (available >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5) return FileFormat::TorchPickle;
  return FileFormat::Unknown;
}

}  // namespace

FileFormat detect_file_format(const uint8_t* data, std::size_t size) { return detect(data, size, size); }

FileFormat detect_file_format(const std::string& path) {
  // Only the first bytes are read: a checkpoint may be gigabytes. O_NONBLOCK:
  // opening a FIFO nobody writes would block forever.
  const std::string where = "cannot read " + quote_input(path) + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(err == ENOENT || err == ENOTDIR ? Error::Kind::Missing : Error::Kind::IO,
                where + detail::errno_text(err));
  }
  struct stat st {};
  std::string refusal;
  if (::fstat(fd, &st) != 0) refusal = detail::errno_text(errno);
  else if (S_ISFIFO(st.st_mode))
    refusal = "is a FIFO (named pipe); its first bytes cannot be looked at without taking them from the reader, "
              "so save it to a file";
  else refusal = detail::input_refusal(st.st_mode);
  uint8_t head[16] = {};
  ssize_t got = 0;
  if (refusal.empty()) {
    while ((got = ::read(fd, head, sizeof head)) < 0 && errno == EINTR) {
    }
    if (got < 0) refusal = detail::errno_text(errno);
  }
  ::close(fd);
  if (!refusal.empty()) throw Error(Error::Kind::IO, where + refusal);
  return detect(head, static_cast<std::size_t>(got), static_cast<uint64_t>(st.st_size));
}

std::string describe(FileFormat format) {
  switch (format) {
    case FileFormat::Npy: return "a .npy array";
    case FileFormat::Safetensors: return "a safetensors file";
    case FileFormat::TorchZip: return "a PyTorch torch.save zip archive";
    case FileFormat::TorchPickle: return "a Python pickle (legacy torch.save)";
    case FileFormat::Unknown: break;
  }
  return "a file of unknown format";
}

}  // namespace multihead
