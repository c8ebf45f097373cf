// tools/file_flags.cpp: see file_flags.hpp.
#include "file_flags.hpp"

#include <unistd.h>

#include <cerrno>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "io/file_util.hpp"

namespace multihead::cli {
namespace {

[[noreturn]] void refuse(const FileFlag& f, const std::string& reason) {
  throw Error(Error::Kind::Value, f.flag + ": cannot write '" + f.path + "': " + reason);
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

void check_output(const FileFlag& out, const std::vector<FileFlag>& inputs) {
  if (is_stdout(out.path)) {
    if (::isatty(STDOUT_FILENO))
      refuse(out, "standard output is a terminal and the bytes are binary; redirect it (> file) or name a file");
    return;
  }
  named(out, [&] { (void)resolve_output_file(out.path); });
  for (const FileFlag& in : inputs)
    if (!in.path.empty() && same_file(out.path, in.path))
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
    for (std::size_t j = 0; j < i; ++j) {
      const FileFlag& other = outputs[j];
      if (other.path.empty()) continue;
      const bool both_stdout = is_stdout(out.path) && is_stdout(other.path);
      const bool one_stdout = is_stdout(out.path) != is_stdout(other.path);
      if (both_stdout || (!one_stdout && same_file(out.path, other.path)))
        refuse(out, "it is also the " + other.flag + " output; give each output its own path");
    }
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
      if (n < 0) refuse(o.file, "standard output: " + detail::errno_text(errno));
      done += static_cast<std::size_t>(n);
    }
  }
  write_files_atomic(files);
}

}  // namespace multihead::cli
