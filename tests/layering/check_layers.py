#!/usr/bin/python3
"""The layering of multihead, written down once, and the check that keeps it.

Every `#include "..."` in src/, include/, tools/ and python/src is parsed; an
include that runs upward fails the check, naming file:line, the header and
both layers. Angle-bracket includes (<omp.h>, <hwy/...>) are outside it.

LAYERS is the order, lowest first: a file in src/<layer>/ may include its own
layer's headers, any lower layer's, and the public headers (include/multihead/,
the API types every layer implements). The order is the one the includes
already follow: core has no internal dependency; contract (the kernels' one
interface and its scalar rules) and simd (Highway kernels, which read the
contract) sit below the kernels that thread and dispatch them; the modules in
attention sit above the kernels; io, weights, train and explain above those,
in the order they were written (none includes another's private headers).
distributed (the MPI modes, its own target) sits on top: it builds on the
modules, the weight readers and the trainer, and nothing in the core library
may reach MPI.

Public headers (include/multihead/) may include each other and nothing in
src/ (they are installed without it). tools/ and python/src use only the
public headers and their own directory's files.

Usage: check_layers.py [--root DIR]   (DIR: the checkout; default: this file's)
"""
import argparse
import pathlib
import re
import sys

# Lowest first. A new folder under src/ goes here, in its place, before it
# builds: the check refuses a folder it does not know.
LAYERS = ["core", "contract", "simd", "kernels", "attention", "io", "weights", "train", "explain", "distributed"]

# Folders whose files use only the public headers (and their own folder).
PUBLIC_ONLY = ["tools", "python/src"]

SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".in"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def rank(layer):
    return LAYERS.index(layer)


def files_under(root, folder):
    base = root / folder
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def includes(path):
    """(line number, included name) for each quoted include of `path`."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            m = INCLUDE_RE.match(line)
            if m:
                yield number, m.group(1)


def target_of(name, including_dir, root):
    """What an include names: ('public', None), ('src', layer), ('local', None)
    for a file beside the includer, or ('other', None) (e.g. a generated or
    third-party header outside the layering)."""
    if ".." in name.split("/"):  # a relative path: where it lands decides
        try:
            parts = (including_dir / name).resolve().relative_to(root.resolve()).parts
        except ValueError:
            return "other", None
        if len(parts) >= 3 and parts[0] == "src":
            return "src", parts[1]
        if parts and parts[0] == "include":
            return "public", None
        return "other", None
    first = name.split("/", 1)[0]
    if first == "multihead":
        return "public", None
    if "/" not in name and (including_dir / name).exists():
        return "local", None
    if "/" in name and (root / "src" / first).is_dir():
        return "src", first
    if first in LAYERS:  # a generated header of a layer (explain/report_assets.hpp)
        return "src", first
    return "other", None


def check(root):
    """The list of violations, each one line 'file:line: message'."""
    root = pathlib.Path(root)
    problems = []
    src = root / "src"
    layer_dirs = sorted(p.name for p in src.iterdir() if p.is_dir()) if src.is_dir() else []
    for d in layer_dirs:
        if d not in LAYERS:
            problems.append(f"src/{d}/: a folder the layer table does not name; add it to LAYERS in "
                            f"tests/layering/check_layers.py (now {' < '.join(LAYERS)})")

    def rel(p):
        return p.relative_to(root).as_posix()

    for layer in layer_dirs:
        if layer not in LAYERS:
            continue
        for path in files_under(root, f"src/{layer}"):
            for number, name in includes(path):
                kind, target = target_of(name, path.parent, root)
                if kind == "src" and target not in LAYERS:
                    problems.append(f"{rel(path)}:{number}: includes \"{name}\" from src/{target}/, "
                                    f"which the layer table does not name")
                elif kind == "src" and rank(target) > rank(layer):
                    problems.append(f"{rel(path)}:{number}: includes \"{name}\": upward, from {layer} "
                                    f"(layer {rank(layer)}) to {target} (layer {rank(target)}); "
                                    f"order: {' < '.join(LAYERS)}")

    for path in files_under(root, "include"):
        for number, name in includes(path):
            kind, target = target_of(name, path.parent, root)
            if kind == "src":
                problems.append(f"{rel(path)}:{number}: includes \"{name}\": a public header may include "
                                f"only public headers (multihead/...), not src/{target}/")

    for folder in PUBLIC_ONLY:
        for path in files_under(root, folder):
            for number, name in includes(path):
                kind, target = target_of(name, path.parent, root)
                if kind == "src":
                    problems.append(f"{rel(path)}:{number}: includes \"{name}\": {folder}/ may include "
                                    f"only public headers (multihead/...) and its own files, not src/{target}/")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[2]))
    args = parser.parse_args(argv)
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} include(s) against the order {' < '.join(LAYERS)}")
        return 1
    print(f"layering: no include runs upward ({' < '.join(LAYERS)}; include/, tools/, python/src public-only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
