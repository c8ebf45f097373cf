// src/io/read_file.cpp: a file's bytes for the .npy and safetensors readers
// (file_util.hpp): a regular file mapped, so each reader checks its header
// against the file's size before it touches the data; a pipe read only as
// far as its header says.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include "core/check.hpp"
#include "io/file_util.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead::detail {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string input_refusal(unsigned mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (!S_ISREG(mode) && !S_ISFIFO(mode)) return "not a regular file";
  return "";
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Closes the descriptor on every exit path, including exceptions.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Error::Kind kind_of(int err) { return (err == ENOENT || err == ENOTDIR) ? Error::Kind::Missing : Error::Kind::IO; }

// The mapped inputs' address ranges, for address_in_mapped_input (io.hpp):
// a fixed table of atomics, so that a signal handler can read it. A slot is
// claimed by a compare-exchange of its begin from 0; a mapping beyond the
// table's slots (more than kSlots inputs mapped at once) is simply not
// recorded, and a SIGBUS in it stays a crash.
constexpr std::size_t kSlots = 64;
struct MappedRange {
  std::atomic<uintptr_t> begin{0}, end{0};
};
MappedRange g_mapped[kSlots];
static_assert(std::atomic<uintptr_t>::is_always_lock_free);

void record_mapping(const void* map, std::size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(map);
  for (MappedRange& r : g_mapped) {
    uintptr_t expected = 0;
    if (r.begin.compare_exchange_strong(expected, begin)) {
      r.end.store(begin + size);
      return;
    }
  }
}

void forget_mapping(const void* map) {
  const auto begin = reinterpret_cast<uintptr_t>(map);
  for (MappedRange& r : g_mapped)
    if (r.begin.load() == begin) {
      r.end.store(0);
      r.begin.store(0);
      return;
    }
}

}  // namespace

FileBytes::FileBytes(FileBytes&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      read_(std::move(other.read_)) {}

FileBytes& FileBytes::operator=(FileBytes&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, map_size_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    read_ = std::move(other.read_);
  }
  return *this;
}

FileBytes::~FileBytes() {
  if (map_) {
    forget_mapping(map_);
    ::munmap(map_, map_size_);
  }
}

FileBytes map_file(const std::string& path, const std::string& name, const ExpectedSize& expected) {
  const std::string where = name + ": cannot read " + quote_input(path) + ": ";
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    const int err = errno;
    throw Error(kind_of(err), where + errno_text(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw Error(Error::Kind::IO, where + errno_text(errno));
  if (const std::string refusal = input_refusal(st.st_mode); !refusal.empty())
    throw Error(Error::Kind::IO, where + refusal);

  FileBytes out;
  // A regular file: mapped, so the reader's header checks come before any
  // data is read (file_util.hpp). Size 0 cannot be mapped, and a file
  // system may refuse to map (ENODEV): both are read below instead.
  if (S_ISREG(st.st_mode) && st.st_size > 0 &&
      static_cast<uint64_t>(st.st_size) <= std::numeric_limits<std::size_t>::max()) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (map != MAP_FAILED) {
      out.map_ = map;
      out.map_size_ = size;
      record_mapping(map, size);
      return out;
    }
  }

  // A pipe: read until EOF, or to one byte past the size its first bytes
  // give. Past that size a pipe is probed with a small buffer before the
  // buffer grows, so it never holds more than its header claims plus 4 KiB.
  auto read_some = [&](uint8_t* dst, std::size_t len) -> std::size_t {
    for (;;) {
      const ssize_t n = ::read(f.fd, dst, len);
      if (n >= 0) return static_cast<std::size_t>(n);
      if (errno != EINTR) throw Error(Error::Kind::IO, where + errno_text(errno));
    }
  };
  std::vector<uint8_t>& bytes = out.read_;
  std::size_t used = 0;
  std::optional<uint64_t> total;  // the file's size, once its first bytes tell
  for (;;) {
    if (expected) {
      if (!total) {
        total = expected(bytes.data(), used);
        // A header that claims more than the machine holds is refused
        // before its data is buffered (`cat big-header.npy /dev/zero |`
        // used to fill memory up to the limit first).
        if (total)
          check_fits_in_memory(name, "reading " + quote_input(path) + " (its header gives " + std::to_string(*total) +
                                         " bytes)",
                               static_cast<double>(*total), "");
      }
      if (total && used > *total) break;
    }
    if (used < bytes.size()) {
      const std::size_t n = read_some(bytes.data() + used, bytes.size() - used);
      if (n == 0) break;
      used += n;
      continue;
    }
    uint8_t probe[4096];
    const std::size_t n = read_some(probe, sizeof probe);
    if (n == 0) break;
    std::size_t grown = std::max({used + n, 2 * used, std::size_t{65536}});
    if (total) grown = std::max<std::size_t>(used + n, std::min<uint64_t>(grown, *total + 1));
    bytes.resize(grown);
    std::copy(probe, probe + n, bytes.begin() + static_cast<std::ptrdiff_t>(used));
    used += n;
  }
  bytes.resize(used);
  return out;
}

}  // namespace multihead::detail

namespace multihead {

// stat(2) and access(2) only: opening a FIFO to check it could block, or
// steal the bytes its writer meant for the real read.
void check_input_file(const std::string& path) {
  const std::string where = "cannot read " + quote_input(path) + ": ";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(detail::kind_of(err), where + detail::errno_text(err));
  }
  if (const std::string refusal = detail::input_refusal(st.st_mode); !refusal.empty())
    throw Error(Error::Kind::IO, where + refusal);
  if (::faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS) != 0)
    throw Error(Error::Kind::IO, where + detail::errno_text(errno));
}

bool address_in_mapped_input(const void* address) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(address);
  for (const detail::MappedRange& r : detail::g_mapped) {
    const uintptr_t begin = r.begin.load(), end = r.end.load();
    if (begin != 0 && begin <= a && a < end) return true;
  }
  return false;
}

}  // namespace multihead
