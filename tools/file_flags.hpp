// tools/file_flags.hpp: the files a subcommand names on its command line, and
// the one rule for them. Every check happens before any work (before even
// the weights are read), so a typo in a folder name costs nothing, and every
// message names the flag and the path in one wording:
//   --query: cannot read 'q.npy': No such file or directory
//   --out: cannot write 'runs/o.npy': folder 'runs' does not exist
//   --out: cannot write 'q.npy': it is the --query input; an output must not overwrite an input
// How a path is written (symlinks followed, devices written in place, FIFOs
// and directories refused) is the library's rule: resolve_output_file.
#pragma once

#include <string>
#include <vector>

namespace multihead::cli {

// A path and the flag that gave it. An empty path means the flag was not
// given and is skipped.
struct FileFlag {
  std::string flag;
  std::string path;
};

// "-" as an output means standard output.
inline bool is_stdout(const std::string& path) { return path == "-"; }

// Throws multihead::Error naming the flag when an input cannot be read, an
// output cannot be written, an output is one of the inputs (same inode,
// whatever the spelling), or two outputs are one file (both "-" included).
// Standard output is refused when it is a terminal: the bytes are binary.
void check_files(const std::vector<FileFlag>& inputs, const std::vector<FileFlag>& outputs);

// An output and its bytes.
struct Output {
  FileFlag file;
  std::string bytes;
};

// Writes every output. Standard output goes first, since a stream cannot be
// taken back; then the files, all or nothing (write_files_atomic): a failure
// changes none of them, and SIGINT or SIGTERM takes effect only once they
// are in place (interrupts.hpp).
void write_outputs(std::vector<Output> outputs);

}  // namespace multihead::cli
