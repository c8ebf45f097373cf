// tools/file_flags.cpp: see file_flags.hpp.
#include "file_flags.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "interrupts.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead::cli {
namespace {

[[noreturn]] void refuse(const FileFlag& f, const std::string& reason) {
  throw Error(Error::Kind::IO, f.flag + ": cannot write " + quote_input(f.path) + ": " + reason);
}

// The library's message with the flag in front.
template <class Check>
void named(const FileFlag& f, Check check) {
  try {
    check();
  } catch (const Error& e) {
    throw Error(e.kind(), f.flag + ": " + e.what());
  }
}

// same_file, where "-" is whatever file standard output is: `>> q.npy`
// would append the output to the --query input.
bool same_target(const std::string& a, const std::string& b) {
  if (is_stdout(a) && is_stdout(b)) return true;
  if (!is_stdout(a) && !is_stdout(b)) return same_file(a, b);
  struct stat out {}, other {};
  return ::fstat(STDOUT_FILENO, &out) == 0 && ::stat((is_stdout(a) ? b : a).c_str(), &other) == 0 &&
         out.st_dev == other.st_dev && out.st_ino == other.st_ino;
}

// The library's refusal, and for a pipe (`--out /dev/stdout | …` is one)
// the way that works.
void check_writable(const FileFlag& out) {
  try {
    (void)resolve_output_file(out.path);
  } catch (const Error& e) {
    struct stat st {};
    const bool pipe = ::stat(out.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
    throw Error(e.kind(), out.flag + ": " + e.what() + (pipe ? "; for standard output, write '-'" : ""));
  }
}

void check_output(const FileFlag& out, const std::vector<FileFlag>& inputs) {
  if (!is_stdout(out.path)) check_writable(out);
  else if (::isatty(STDOUT_FILENO))
    refuse(out, "standard output is a terminal and the bytes are binary; redirect it (> file) or name a file");
  for (const FileFlag& in : inputs)
    if (!in.path.empty() && same_target(out.path, in.path))
      refuse(out, "it is the " + in.flag + " input; an output must not overwrite an input");
}

}  // namespace

void check_files(const std::vector<FileFlag>& inputs, const std::vector<FileFlag>& outputs) {
  for (const FileFlag& in : inputs)
    if (!in.path.empty()) named(in, [&] { check_input_file(in.path); });
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const FileFlag& out = outputs[i];
    if (out.path.empty()) continue;
    check_output(out, inputs);
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_target(out.path, outputs[j].path))
        refuse(out, "it is also the " + outputs[j].flag + " output; give each output its own path");
  }
}

void write_outputs(std::vector<Output> outputs) {
  std::vector<FileToWrite> files;
  for (Output& o : outputs) {
    if (!is_stdout(o.file.path)) {
      files.push_back({o.file.path, std::move(o.bytes), o.file.flag});
      continue;
    }
    std::size_t done = 0;
    while (done < o.bytes.size()) {
      const ssize_t n = ::write(STDOUT_FILENO, o.bytes.data() + done, o.bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) refuse(o.file, "standard output: " + std::generic_category().message(errno));
      done += static_cast<std::size_t>(n);
    }
  }
  // From the first temporary to the last rename, SIGINT and SIGTERM wait
  // (interrupts.hpp): they cannot leave a NAME.tmp.XXXXXX behind.
  const DeferInterrupts defer;
  write_files_atomic(files);
}

}  // namespace multihead::cli
