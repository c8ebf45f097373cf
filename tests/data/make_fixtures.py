#!/usr/bin/python3
"""Writes the .npy and safetensors fixtures that tests/test_io.cpp reads.

The .npy files come from NumPy itself (numpy.save / numpy.lib.format), the
safetensors files are assembled byte by byte here following the format's
README (8-byte little-endian header length, JSON header, data buffer), with
bfloat16 bits from PyTorch. expected.json holds, for every fixture, the dtype
name, the shape and the C-order values as float.hex() strings, converted to
float64 by NumPy / PyTorch, so the C++ test checks our reader against values
that never passed through it.

Run with the system interpreter (it has numpy and torch):
    /usr/bin/python3 tests/data/make_fixtures.py
The output is deterministic; rerunning it must leave git status clean.
"""
import io
import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def hexes(values):
    """float64 values, C order, as exact strings strtod parses back."""
    return [float(v).hex() for v in np.asarray(values, dtype=np.float64).ravel(order="C")]


def npy_entry(arr, dtype_name):
    return {"dtype": dtype_name, "shape": list(arr.shape), "values": hexes(arr.astype(np.float64))}


def write_npy_fixtures(expected):
    out = os.path.join(HERE, "npy")
    os.makedirs(out, exist_ok=True)
    f32 = np.array([[1.0, -0.0, np.inf], [1e-45, np.nan, -3.25]], dtype=np.float32)
    f64 = np.array([np.pi, 5e-324, -np.inf, 1e300], dtype=np.float64)
    # float16 specials: smallest subnormal, largest subnormal, smallest normal,
    # max, -0, inf, -inf, nan, and 1/3 rounded.
    f16 = np.array([[[2.0**-24, 1023 * 2.0**-24], [2.0**-14, 65504.0]],
                    [[-0.0, np.inf], [-np.inf, np.nan]],
                    [[1.0 / 3.0, -2.5], [0.099975586, 7.0]]], dtype=np.float16)
    cube = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * np.float32(0.5) - np.float32(3.0)
    cases = {
        "f4_c.npy": (f32, "float32"),
        "f8_c.npy": (f64, "float64"),
        "f2_c.npy": (f16, "float16"),
        "f4_be.npy": (f32.astype(">f4"), "float32"),
        "f8_be.npy": (f64.astype(">f8"), "float64"),
        "f2_be.npy": (f16.astype(">f2"), "float16"),
        "f4_fortran.npy": (np.asfortranarray(cube), "float32"),
        "f8_fortran_be.npy": (np.asfortranarray((np.arange(6).reshape(3, 2) + 0.125).astype(">f8")), "float64"),
        "b1.npy": (np.array([[True, False, True, True, False], [False, False, True, False, True]]), "bool"),
        "u1.npy": (np.array([0, 1, 2, 255, 0, 7], dtype=np.uint8), "bool"),
        "f8_0d.npy": (np.array(2.5, dtype=np.float64), "float64"),
        "f4_empty.npy": (np.zeros((0, 3), dtype=np.float32), "float32"),
    }
    for fname, (arr, dtype_name) in cases.items():
        np.save(os.path.join(out, fname), arr)
        entry = npy_entry(arr, dtype_name)
        if arr.dtype == np.uint8:  # read as mask values: nonzero -> 1
            entry["values"] = hexes((arr != 0).astype(np.float64))
        expected["npy/" + fname] = entry
    # Format versions 2.0 and 3.0 (4-byte header length), written explicitly.
    for version in [(2, 0), (3, 0)]:
        fname = "f4_v%d.npy" % version[0]
        with open(os.path.join(out, fname), "wb") as f:
            np.lib.format.write_array(f, f32, version=version)
        expected["npy/" + fname] = npy_entry(f32, "float32")
    # Byte-for-byte references for our writer: what numpy.save writes for
    # float32, float64 and bool arrays of rank 2, 1 and 0.
    exact = {
        "save_f4_2x3.npy": np.array([[0.5, -1.0, 2.0], [3.0, 1e-3, -7.5]], dtype=np.float32),
        "save_f8_5.npy": np.array([1.0, -2.0, 0.1, 1e-300, 12345.678], dtype=np.float64),
        "save_b1_0d.npy": np.array(True),
        "save_b1_2x2.npy": np.array([[True, False], [False, True]]),
    }
    for fname, arr in exact.items():
        np.save(os.path.join(out, fname), arr)
        expected["npy/" + fname] = npy_entry(arr, "bool" if arr.dtype == np.bool_ else str(arr.dtype))


def safetensors_bytes(tensors, metadata):
    """tensors: list of (name, dtype string, shape, raw bytes), laid out in order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, _, raw in tensors)


def write_safetensors_fixtures(expected):
    out = os.path.join(HERE, "safetensors")
    os.makedirs(out, exist_ok=True)
    f16 = np.array([[2.0**-24, -65504.0, np.inf], [np.nan, -0.0, 0.333]], dtype=np.float16)
    # bfloat16 specials: smallest subnormal (2^-133), smallest normal,
    # largest finite, inf, -inf, nan, -0, and a value that rounds.
    bf16 = torch.tensor([2.0**-133, 2.0**-126, 3.3895313892515355e38, float("inf"),
                         float("-inf"), float("nan"), -0.0, 1.0 / 3.0], dtype=torch.bfloat16)
    bf16_bits = bf16.view(torch.int16).numpy().astype("<i2")
    f32 = np.array([[1.5, -2.0e-40], [3.4028234663852886e38, -np.inf]], dtype="<f4")
    f64 = np.array([np.e, -5e-324, np.nan], dtype="<f8")
    mask = np.array([[0, 1], [3, 0]], dtype=np.uint8)  # BOOL bytes; 3 reads as true
    scalar = np.array(-0.75, dtype="<f8")
    empty = np.zeros((0, 4), dtype="<f4")
    tensors = [
        ("layer.bf16", "BF16", bf16.shape, bf16_bits.tobytes()),
        ("layer.f16", "F16", f16.shape, f16.astype("<f2").tobytes()),
        ("layer.f32", "F32", f32.shape, f32.tobytes()),
        ("layer.f64", "F64", f64.shape, f64.tobytes()),
        ("mask", "BOOL", mask.shape, mask.tobytes()),
        ("scalar", "F64", scalar.shape, scalar.tobytes()),
        ("empty", "F32", empty.shape, empty.tobytes()),
    ]
    metadata = {"format": "pt", "note": "fixture \u00e9"}
    with open(os.path.join(out, "mixed.safetensors"), "wb") as f:
        f.write(safetensors_bytes(tensors, metadata))
    expected["safetensors/mixed.safetensors"] = {
        "metadata": metadata,
        "tensors": {
            "layer.bf16": {"dtype": "bfloat16", "shape": list(bf16.shape), "values": hexes(bf16.double().numpy())},
            "layer.f16": npy_entry(f16, "float16"),
            "layer.f32": npy_entry(f32, "float32"),
            "layer.f64": npy_entry(f64, "float64"),
            "mask": {"dtype": "bool", "shape": [2, 2], "values": hexes((mask != 0).astype(np.float64))},
            "scalar": npy_entry(scalar, "float64"),
            "empty": npy_entry(empty, "float32"),
        },
    }
    # No metadata, one tensor.
    w = np.arange(12, dtype="<f4").reshape(3, 4) / np.float32(8.0)
    with open(os.path.join(out, "plain.safetensors"), "wb") as f:
        f.write(safetensors_bytes([("weight", "F32", w.shape, w.tobytes())], None))
    expected["safetensors/plain.safetensors"] = {"metadata": {}, "tensors": {"weight": npy_entry(w, "float32")}}


def main():
    expected = {}
    write_npy_fixtures(expected)
    write_safetensors_fixtures(expected)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
