// src/io/atomic_file.cpp: write_file_atomic, the one way the library writes
// a file. The bytes go to a temporary file in the destination folder (same
// file system, so rename(2) is atomic), are fsynced, and the temporary is
// renamed over the target: readers see the old file or the new one, never a
// partial one, and a failure leaves the old file untouched.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "io/file_util.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {

namespace {

// mkstemp creates the file with mode 0600; a written file should get the
// usual 0666 & ~umask. umask(2) can only be read by setting it, which races
// with other threads, so read it from /proc (Linux >= 4.7), else assume 022.
mode_t file_mode() {
  mode_t mask = 022;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) {
      mask = static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
      break;
    }
  }
  return 0666 & ~mask;
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string what = "cannot write '" + path + "': ";
  if (path.empty()) throw Error(Error::Kind::IO, what + "empty path");

  std::vector<char> tmp_name(path.begin(), path.end());
  const std::string suffix = ".tmp.XXXXXX";
  tmp_name.insert(tmp_name.end(), suffix.begin(), suffix.end());
  tmp_name.push_back('\0');
  int fd = ::mkostemp(tmp_name.data(), O_CLOEXEC);
  if (fd < 0) {
    throw Error(Error::Kind::IO, what + "creating a temporary file: " + detail::errno_text(errno));
  }

  // From here on every failure removes the temporary file before throwing.
  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp_name.data());
    throw Error(Error::Kind::IO, what + step + ": " + detail::errno_text(err));
  };

  if (::fchmod(fd, file_mode()) != 0) fail("setting permissions", errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing", errno);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("syncing", errno);
  // close() can report a deferred write error (NFS); the descriptor is gone
  // either way, so do not close it again in fail().
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("closing", errno);
  if (::rename(tmp_name.data(), path.c_str()) != 0) fail("renaming the temporary file", errno);

  // Make the rename itself durable. Best effort: some file systems refuse
  // fsync on a directory, and the data is already in place.
  const int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

}  // namespace multihead
