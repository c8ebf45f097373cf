"""Hand-written safetensors reader/writer (no pip packages on the test machine).

Layout (https://github.com/huggingface/safetensors):
  8-byte little-endian header length N, N bytes of JSON (padded with spaces to
  a multiple of 8), then the data buffer. Each JSON entry is
  {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]} with offsets
  relative to the buffer; "__metadata__" maps strings to strings.

Values travel as float64 numpy arrays. `round_to_dtype` gives the values a
tensor has after it is stored in a dtype, so a reference can be computed from
exactly what the file holds.
"""
import json
import struct

import numpy as np
import torch

DTYPES = ("F32", "F64", "F16", "BF16")
_ITEMSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "BOOL": 1}


def encode(values, dtype):
    """float64 array -> (bytes as stored in `dtype`, float64 values after rounding)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if dtype == "F64":
        stored = values.astype("<f8")
        return stored.tobytes(), stored.astype(np.float64)
    if dtype == "F32":
        stored = values.astype("<f4")
        return stored.tobytes(), stored.astype(np.float64)
    if dtype == "F16":
        stored = values.astype("<f2")
        return stored.tobytes(), stored.astype(np.float64)
    if dtype == "BF16":
        # torch rounds to nearest even; the bits are the upper half of the f32.
        t = torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
        raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
        return raw, t.to(torch.float64).numpy()
    raise ValueError(f"unsupported dtype {dtype}")


def round_to_dtype(values, dtype):
    return encode(values, dtype)[1]


def build_header(entries, metadata=None):
    """entries: list of (name, dtype, shape, begin, end). Returns padded header bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dtype, shape, begin, end in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return text


def serialize(tensors, metadata=None):
    """tensors: dict name -> (float64 array, dtype). Returns (file bytes,
    dict name -> float64 values after rounding to the stored dtype)."""
    entries, chunks, rounded, offset = [], [], {}, 0
    for name in sorted(tensors):
        values, dtype = tensors[name]
        raw, rounded[name] = encode(values, dtype)
        entries.append((name, dtype, np.shape(values), offset, offset + len(raw)))
        chunks.append(raw)
        offset += len(raw)
    header = build_header(entries, metadata)
    return struct.pack("<Q", len(header)) + header + b"".join(chunks), rounded


def write(path, tensors, metadata=None):
    data, rounded = serialize(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)
    return rounded


def read(path):
    """Returns (dict name -> (float64 array, dtype), metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode())
    buffer = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        dtype, shape = info["dtype"], tuple(info["shape"])
        begin, end = info["data_offsets"]
        raw = buffer[begin:end]
        count = int(np.prod(shape)) if shape else 1
        if len(raw) != count * _ITEMSIZE[dtype]:
            raise ValueError(f"{path}: {name} has {len(raw)} bytes, expected {count * _ITEMSIZE[dtype]}")
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32).astype(np.float64)
        else:
            np_dtype = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BOOL": "|b1"}[dtype]
            values = np.frombuffer(raw, dtype=np_dtype).astype(np.float64)
        tensors[name] = (values.reshape(shape), dtype)
    return tensors, metadata
