#!/usr/bin/python3
"""Writes the seed corpora in fuzz/corpus/: valid files (copies of the test
fixtures in tests/data/) and near-valid ones that stop at each check of the
readers, so the fuzzer starts past the magic bytes and the JSON syntax.
Deterministic; run with /usr/bin/python3 after tests/data/make_fixtures.py."""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")


def npy(header, data, major=1):
    h = header.encode("latin1")
    pre = 10 if major == 1 else 12
    h += b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    size = struct.pack("<H" if major == 1 else "<I", len(h))
    return b"\x93NUMPY" + bytes([major, 0]) + size + h + data


def st(header, buffer):
    h = header.encode("utf-8")
    return struct.pack("<Q", len(h)) + h + buffer


def main():
    out = os.path.join(HERE, "corpus", "npy")
    os.makedirs(out, exist_ok=True)
    for name in ["f4_c.npy", "f2_be.npy", "f4_fortran.npy", "f8_fortran_be.npy", "b1.npy", "u1.npy",
                 "f8_0d.npy", "f4_empty.npy", "f4_v2.npy", "f4_v3.npy"]:
        shutil.copy(os.path.join(DATA, "npy", name), os.path.join(out, "valid_" + name))
    near = {
        "truncated_data": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5), }", b"\0" * 12),
        "trailing_data": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", b"\0" * 12),
        "dtype_i8": npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8),
        "huge_shape": npy("{'descr': '|b1', 'fortran_order': True, 'shape': (1152921504606846976, 3), }", b"\1"),
        "dialect": npy("{\"shape\":(2L,3L),\"descr\":\"<f2\",\"fortran_order\":True}", b"\0\x3c" * 6, 2),
    }
    for name, data in near.items():
        with open(os.path.join(out, "near_" + name + ".npy"), "wb") as f:
            f.write(data)

    out = os.path.join(HERE, "corpus", "safetensors")
    os.makedirs(out, exist_ok=True)
    for name in ["mixed.safetensors", "plain.safetensors"]:
        shutil.copy(os.path.join(DATA, "safetensors", name), os.path.join(out, "valid_" + name))
    entry = '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'
    near = {
        "overlap": st('{"a":%s,"b":%s}' % (entry % ("F32", "[4]", 0, 16), entry % ("F32", "[4]", 8, 24)), b"\0" * 24),
        "dtype_f8": st('{"w":%s}' % (entry % ("F8_E4M3", "[1]", 0, 1)), b"\0"),
        "i64_short": st('{"n":%s}' % (entry % ("I64", "[2]", 0, 16)), b"\0" * 12),
        "past_buffer": st('{"w":%s}' % (entry % ("BF16", "[2,2]", 0, 8)), b"\0" * 4),
        "metadata_number": st('{"__metadata__":{"a":"b","n":1},"w":%s}' % (entry % ("BOOL", "[]", 0, 1)), b"\1"),
        "duplicate": st('{"w":%s,"w":%s}' % (entry % ("F16", "[1]", 0, 2), entry % ("F16", "[1]", 2, 4)), b"\0" * 4),
    }
    for name, data in near.items():
        with open(os.path.join(out, "near_" + name + ".safetensors"), "wb") as f:
            f.write(data)
    # A whole model's integer buffers beside a weight: int64 (num_batches_tracked,
    # position_ids) and a uint8 mask. Then two elements of each integer dtype,
    # every 16 bytes (gaps are allowed).
    buffers = '{"w":%s,"bn.num_batches_tracked":%s,"pos":%s,"mask":%s}' % (
        entry % ("F32", "[2]", 0, 8), entry % ("I64", "[]", 8, 16), entry % ("I64", "[1,3]", 16, 40),
        entry % ("U8", "[2,2]", 40, 44))
    ints = [("U8", 1), ("I8", 1), ("U16", 2), ("I16", 2), ("U32", 4), ("I32", 4), ("U64", 8), ("I64", 8)]
    every = ",".join('"%s":%s' % (d.lower(), entry % (d, "[2]", 16 * i, 16 * i + 2 * n))
                     for i, (d, n) in enumerate(ints))
    valid = {"buffers": st(buffers, bytes(range(44))), "every_integer": st("{%s}" % every, b"\1" * 128)}
    for name, data in valid.items():
        with open(os.path.join(out, "valid_" + name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
