#!/usr/bin/python3
"""The layering check, tested on tiny fake trees: each case writes a tree,
runs check_layers.py on it as ctest would (a process, its exit code and its
output) and states what it expects. Testing the checker itself: an upward
include must fail it, naming file:line."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

CHECKER = pathlib.Path(__file__).resolve().parent / "check_layers.py"

# A clean tree: every layer of the table, each including the one below, a
# public header including another, and a tool that uses only the public API.
CLEAN = {
    "include/multihead/tensor.hpp": "#pragma once\n",
    "include/multihead/attention.hpp": '#pragma once\n#include "multihead/tensor.hpp"\n',
    "src/core/check.hpp": '#pragma once\n#include "multihead/tensor.hpp"\n',
    "src/contract/args.hpp": '#pragma once\n#include "multihead/attention.hpp"\n',
    "src/simd/flash.hpp": '#pragma once\n#include "contract/args.hpp"\n#include "hwy/highway.h"\n',
    "src/kernels/flash.cpp": '#include "simd/flash.hpp"\n#include "contract/args.hpp"\n#include <omp.h>\n',
    "src/attention/module.cpp": '#include "kernels/kernel.hpp"\n#include "core/check.hpp"\n',
    "src/kernels/kernel.hpp": '#pragma once\n#include "contract/args.hpp"\n',
    "src/io/npy.cpp": '#include "io/bytes.hpp"\n',
    "src/io/bytes.hpp": "#pragma once\n",
    "src/weights/weights.cpp": '#include "core/check.hpp"\n',
    "src/train/model.cpp": '#include "contract/args.hpp"\n',
    "src/explain/report.cpp": '#include "explain/report_assets.hpp"\n',  # generated at build time
    "tools/main.cpp": '#include "commands.hpp"\n#include "multihead/attention.hpp"\n',
    "tools/commands.hpp": "#pragma once\n",
    "python/src/module.cpp": '#include "arrays.hpp"\n#include "multihead/tensor.hpp"\n',
    "python/src/arrays.hpp": "#pragma once\n",
}


def run_on(files):
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        r = subprocess.run([sys.executable, str(CHECKER), "--root", str(root)],
                           capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr


def with_file(rel, text):
    files = dict(CLEAN)
    files[rel] = text
    return files


class CheckLayers(unittest.TestCase):
    def expect_failure(self, files, *fragments):
        rc, out = run_on(files)
        self.assertEqual(rc, 1, f"expected exit 1, got {rc}; output:\n{out}")
        for fragment in fragments:
            self.assertIn(fragment, out, f"expected {fragment!r} in the output:\n{out}")

    def test_clean_tree_passes(self):
        rc, out = run_on(CLEAN)
        self.assertEqual(rc, 0, f"expected exit 0 on the clean tree, got {rc}; output:\n{out}")

    def test_core_including_attention_fails_naming_file_and_line(self):
        files = with_file("src/core/check.hpp",
                          '#pragma once\n#include "multihead/tensor.hpp"\n#include "attention/workspace.hpp"\n')
        self.expect_failure(files, "src/core/check.hpp:3:", '"attention/workspace.hpp"', "upward",
                            "from core (layer 0) to attention (layer 4)")

    def test_contract_including_simd_fails(self):
        self.expect_failure(with_file("src/contract/args.hpp", '#include "simd/flash.hpp"\n'),
                            "src/contract/args.hpp:1:", "from contract (layer 1) to simd (layer 2)")

    def test_kernels_including_attention_fails(self):
        self.expect_failure(with_file("src/kernels/kernel.hpp", '\n\n#include "attention/mha_plan.hpp"\n'),
                            "src/kernels/kernel.hpp:3:", "from kernels (layer 3) to attention (layer 4)")

    def test_indented_include_with_spaces_is_parsed(self):
        self.expect_failure(with_file("src/simd/flash.hpp", '#if X\n  #  include "kernels/kernel.hpp"\n#endif\n'),
                            "src/simd/flash.hpp:2:")

    def test_relative_path_into_a_higher_layer_fails(self):
        self.expect_failure(with_file("src/core/check.hpp", '#include "../attention/module.cpp"\n'),
                            "src/core/check.hpp:1:", "to attention")

    def test_public_header_including_src_fails(self):
        self.expect_failure(with_file("include/multihead/attention.hpp", '#include "core/check.hpp"\n'),
                            "include/multihead/attention.hpp:1:", "only public headers")

    def test_tool_including_src_fails(self):
        self.expect_failure(with_file("tools/main.cpp", '#include "multihead/tensor.hpp"\n#include "kernels/kernel.hpp"\n'),
                            "tools/main.cpp:2:", "tools/ may include only public headers")

    def test_python_including_src_fails(self):
        self.expect_failure(with_file("python/src/module.cpp", '#include "attention/module.hpp"\n'),
                            "python/src/module.cpp:1:", "python/src/ may include only public headers")

    def test_unknown_src_folder_fails(self):
        self.expect_failure(with_file("src/kernel/old.hpp", "#pragma once\n"),
                            "src/kernel/: a folder the layer table does not name")


if __name__ == "__main__":
    unittest.main(verbosity=2)
