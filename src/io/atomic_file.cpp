// src/io/atomic_file.cpp: write_file_atomic, the one way the library writes
// a file. The bytes go to a temporary file in the destination folder (same
// file system, so rename(2) is atomic), are fsynced, and the temporary is
// renamed over the target: readers see the old file or the new one, never a
// partial one, and a failure leaves the old file untouched.
//
// rename(2) replaces whatever has the target's name, so before writing we
// decide what the name really is (resolve_output_file): a symlink is
// followed, so that the file it names is replaced and the link survives; a
// character device is written in place, since replacing /dev/null with a
// regular file would break every other program; anything else that is not a
// regular file is refused.
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/file_util.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {

namespace {

using detail::errno_text;
using detail::folder_of;

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

// The start of every message about writing `path`. Through a symlink it also
// names the target, which is what the reason is usually about.
std::string cannot_write(const std::string& path, const std::string& target) {
  std::string what = "cannot write " + quote_input(path);
  if (target != path) what += " (a symlink to " + quote_input(target) + ")";
  return what + ": ";
}

// Follows the last component of `path` through symlinks, as open(2) would,
// to the name a write should replace. Relative links are relative to the
// link's folder. After 40 links (the kernel's limit) it stops, and the stat
// of the result reports ELOOP.
std::string follow_symlinks(const std::string& path) {
  std::string at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    std::vector<char> buf(PATH_MAX + 1);
    const ssize_t n = ::readlink(at.c_str(), buf.data(), buf.size() - 1);
    if (n < 0) return at;
    const std::string link(buf.data(), static_cast<std::size_t>(n));
    at = (!link.empty() && link.front() == '/') ? link : folder_of(at) + "/" + link;
  }
  return at;
}

// The descriptor link `path` goes through, if any: /dev/stdout, /dev/fd/N and
// /proc/self/fd/N are symlinks in a /proc/<pid>/fd folder, naming a file
// the process already has open, often a shell's `>> log`. Renaming over it
// would replace the whole file, not add to it. Returns "" when there is none.
std::string descriptor_link(const std::string& path) {
  std::string at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return "";
    std::unique_ptr<char, decltype(&std::free)> folder(::realpath(folder_of(at).c_str(), nullptr), &std::free);
    const std::string dir = folder ? folder.get() : "";
    if (dir.rfind("/proc/", 0) == 0 && dir.size() > 9 && dir.compare(dir.size() - 3, 3, "/fd") == 0) return at;
    std::vector<char> buf(PATH_MAX + 1);
    const ssize_t n = ::readlink(at.c_str(), buf.data(), buf.size() - 1);
    if (n < 0) return "";
    const std::string link(buf.data(), static_cast<std::size_t>(n));
    at = (!link.empty() && link.front() == '/') ? link : folder_of(at) + "/" + link;
  }
  return "";
}

// Why a file of this st_mode, not regular and not a character device, must
// not be written.
std::string special_file_refusal(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe); refusing to write to it, since with no reader the write would block";
  if (S_ISSOCK(mode)) return "is a socket; refusing to write to it";
  if (S_ISBLK(mode)) return "is a block device; refusing to overwrite it";
  return "is not a regular file";
}

// The rename needs a folder that exists and that we may write into. As root
// access(2) says yes to everything but a read-only file system; the write
// then really succeeds, so the answer is still right.
std::string folder_refusal(const std::string& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return "folder " + quote_input(folder) + " does not exist";
    return "folder " + quote_input(folder) + ": " + errno_text(err);
  }
  if (!S_ISDIR(st.st_mode)) return quote_input(folder) + " is not a folder";
  if (::faccessat(AT_FDCWD, folder.c_str(), W_OK | X_OK, AT_EACCESS) != 0)
    return "folder " + quote_input(folder) + " is not writable (" + errno_text(errno) + ")";
  return "";
}

// write(2) until every byte is out, through EINTR and short writes.
int write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// A file written under a temporary name next to its target, removed again
// unless commit() renamed it into place.
class StagedFile {
 public:
  StagedFile(const std::string& target, const std::string& bytes, const std::string& what);
  ~StagedFile() {
    if (!committed_) ::unlink(tmp_.c_str());
  }
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  void commit();

 private:
  std::string target_, tmp_, what_;
  bool committed_ = false;
};

StagedFile::StagedFile(const std::string& target, const std::string& bytes, const std::string& what)
    : target_(target), what_(what) {
  // Named after the target, cut so that a target of NAME_MAX bytes, or a
  // path just under PATH_MAX, still leaves room for the suffix.
  static constexpr char kSuffix[] = ".tmp.XXXXXX";
  const std::string folder = folder_of(target) + "/";
  const std::string base = target.substr(target.find_last_of('/') + 1);
  const std::size_t room = PATH_MAX - 1 - std::min<std::size_t>(folder.size() + sizeof kSuffix - 1, PATH_MAX - 1);
  std::string name = folder + base.substr(0, std::min<std::size_t>(200, room)) + kSuffix;
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) throw Error(Error::Kind::IO, what + "creating a temporary file: " + errno_text(errno));
  // A throwing constructor runs no destructor: fail() cleans up itself.
  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(name.c_str());
    throw Error(Error::Kind::IO, what + step + ": " + errno_text(err));
  };
  if (::fchmod(fd, file_mode()) != 0) fail("setting permissions", errno);
  if (const int err = write_all(fd, bytes)) fail("writing", err);
  if (::fsync(fd) != 0) fail("syncing", errno);
  // close() can report a deferred write error (NFS); the descriptor is gone
  // either way, so fail() must not close it again.
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("closing", errno);
  tmp_ = name;
}

void StagedFile::commit() {
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    throw Error(Error::Kind::IO, what_ + "renaming the temporary file: " + errno_text(errno));
  committed_ = true;
  // Make the rename itself durable. Best effort: some file systems refuse
  // fsync on a directory, and the data is already in place.
  const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

// A character device takes the bytes in place: no temporary, no rename, and
// no fsync (which /dev/null and terminals refuse).
void write_device(const std::string& target, const std::string& bytes, const std::string& what) {
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw Error(Error::Kind::IO, what + errno_text(errno));
  const int err = write_all(fd, bytes);
  const int closed = ::close(fd) == 0 ? 0 : errno;
  if (err || closed) throw Error(Error::Kind::IO, what + "writing: " + errno_text(err ? err : closed));
}

std::string prefixed(const std::string& name, const std::string& text) {
  return name.empty() ? text : name + ": " + text;
}

}  // namespace

OutputFile resolve_output_file(const std::string& path) {
  if (path.empty()) throw Error(Error::Kind::IO, "cannot write '': empty path");
  OutputFile out;
  struct stat st {};
  // What the path opens decides first: that also classifies /proc's magic
  // links (/dev/stdout -> /proc/self/fd/1 -> "pipe:[…]"), whose link text is
  // not a path.
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    out.target = path;
    const std::string what = cannot_write(path, path);
    if (!S_ISCHR(st.st_mode)) throw Error(Error::Kind::IO, what + special_file_refusal(st.st_mode));
    if (::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0)
      throw Error(Error::Kind::IO, what + errno_text(errno));
    out.kind = OutputFile::Kind::Device;
    return out;
  }
  out.target = follow_symlinks(path);
  const std::string what = cannot_write(path, out.target);
  if (const std::string fd = descriptor_link(path); !fd.empty())
    throw Error(Error::Kind::IO, what + quote_input(fd) + " is an open file descriptor of this process; replacing "
                                     "its file would discard what the file held (a shell's >>); for standard "
                                     "output, write '-'");
  if (::stat(out.target.c_str(), &st) == 0) out.kind = OutputFile::Kind::Replace;
  else if (errno != ENOENT) throw Error(Error::Kind::IO, what + errno_text(errno));
  if (const std::string refusal = folder_refusal(folder_of(out.target)); !refusal.empty())
    throw Error(Error::Kind::IO, what + refusal);
  return out;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  const bool a_exists = ::stat(a.c_str(), &sa) == 0, b_exists = ::stat(b.c_str(), &sb) == 0;
  if (a_exists && b_exists) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (a_exists != b_exists) return false;
  // Neither exists yet: compare the names they would get, with the folders
  // resolved (the folders may not exist either; then compare as written).
  auto resolved = [](const std::string& path) {
    const std::string target = follow_symlinks(path);
    std::unique_ptr<char, decltype(&std::free)> folder(::realpath(folder_of(target).c_str(), nullptr), &std::free);
    const std::string base = target.substr(target.find_last_of('/') + 1);
    return folder ? std::string(folder.get()) + "/" + base : target;
  };
  return resolved(a) == resolved(b);
}

namespace {

// One file of a write, by reference, so that write_file_atomic does not copy
// its (possibly large) bytes.
struct Pending {
  const std::string& path;
  const std::string& bytes;
  const std::string& name;
};

void write_all_or_nothing(const std::vector<Pending>& files) {
  // Every check before the first byte is written.
  std::vector<OutputFile> targets;
  std::vector<std::string> what;
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      targets.push_back(resolve_output_file(files[i].path));
    } catch (const Error& e) {
      throw Error(e.kind(), prefixed(files[i].name, e.what()));
    }
    what.push_back(prefixed(files[i].name, cannot_write(files[i].path, targets[i].target)));
    for (std::size_t j = 0; j < i; ++j)
      if (same_file(files[i].path, files[j].path))
        throw Error(Error::Kind::IO, what[i] + "the same file as " + quote_input(files[j].path));
  }
  std::vector<std::unique_ptr<StagedFile>> staged;  // removed on the way out unless committed
  for (std::size_t i = 0; i < files.size(); ++i)
    if (targets[i].kind != OutputFile::Kind::Device)
      staged.push_back(std::make_unique<StagedFile>(targets[i].target, files[i].bytes, what[i]));
  for (std::size_t i = 0; i < files.size(); ++i)
    if (targets[i].kind == OutputFile::Kind::Device) write_device(targets[i].target, files[i].bytes, what[i]);
  for (auto& s : staged) s->commit();
}

}  // namespace

void write_files_atomic(const std::vector<FileToWrite>& files) {
  std::vector<Pending> pending;
  for (const auto& f : files) pending.push_back({f.path, f.bytes, f.name});
  write_all_or_nothing(pending);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  static const std::string no_name;
  write_all_or_nothing({Pending{path, bytes, no_name}});
}

}  // namespace multihead
