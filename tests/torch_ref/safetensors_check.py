#!/usr/bin/env python3
"""A small, independent safetensors reader and writer (struct + json + torch), and an interop check.

Debian's python3 has torch and numpy but not the `safetensors` package, so this module
reimplements the format (https://github.com/huggingface/safetensors) from its specification:

    8 bytes   little-endian u64 N, the header length
    N bytes   JSON header: {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
                            "__metadata__": {str: str}}   (offsets relative to the data section)
    rest      the data section: each tensor row-major, little-endian, the byte ranges tiling it

Library use (e.g. from the model golden tests):
    from safetensors_check import load, save
    tensors = load("model.safetensors")          # dict[str, torch.Tensor], CPU, owning copies
    save("out.safetensors", tensors, {"format": "pt"})

Command line (used by tests/test_safetensors.cpp):
    safetensors_check.py write OUT.safetensors     write the reference tensors (python_reference)
    safetensors_check.py verify IN.safetensors     check IN holds exactly the expected tensors
    safetensors_check.py check IN OUT              verify IN, then write OUT (one torch import)
Each prints OK and exits 0, or prints what is wrong and exits 1.
"""

import json
import struct
import sys

import torch

# safetensors dtype name -> torch dtype. Element sizes come from torch.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}

MAX_HEADER_BYTES = 100_000_000


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def load(path, with_metadata=False):
    """Read a safetensors file into {name: torch.Tensor} (CPU tensors owning their memory).

    The file is validated strictly, like the reference implementation: known dtypes only,
    shape x dtype size equal to each byte range, and byte ranges tiling the data section with
    no overlap, gap or trailing bytes. Raises ValueError naming the file (and tensor) otherwise.
    With with_metadata=True returns (tensors, metadata dict).
    """
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: file of {len(raw)} bytes is too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} does not fit the file of {len(raw)} bytes")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    data = raw[8 + n :]
    metadata = header.pop("__metadata__", None) or {}

    tensors = {}
    spans = []
    for name, entry in header.items():
        dtype = _DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {entry.get('dtype')!r}")
        shape = [int(d) for d in entry["shape"]]
        begin, end = (int(x) for x in entry["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(data) or end - begin != numel * _element_size(dtype):
            raise ValueError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}) do not fit "
                             f"shape {shape} of {entry['dtype']} in a data section of {len(data)} bytes")
        spans.append((begin, end, name))
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # bytearray: torch.frombuffer wants a writable buffer, and the copy owns its memory.
            buf = bytearray(data[begin:end])
            tensors[name] = torch.frombuffer(buf, dtype=dtype).reshape(shape)
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected:
            raise ValueError(f"{path}: tensor '{name}': starts at {begin}, expected {expected} (gap or overlap)")
        expected = end
    if expected != len(data):
        raise ValueError(f"{path}: {len(data) - expected} trailing bytes after the last tensor")
    return (tensors, metadata) if with_metadata else tensors


def save(path, tensors, metadata=None):
    """Write {name: torch.Tensor} to `path` as Hugging Face's writer does.

    Tensors are laid out by descending element size, then name, so each starts aligned; the
    header is padded with spaces to a multiple of 8 bytes. `metadata` is an optional str->str dict.
    """
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in items:
        t = t.detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {t.dtype}")
        # Through uint8 so bf16 needs no numpy support.
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---- the interop check ---------------------------------------------------------------------------
# tests/test_safetensors.cpp builds the same tensors (shared_reference) in C++. Every value is
# exactly representable in its dtype, so comparisons are exact.

SHARED_METADATA = {"format": "pt", "producer": "shardlm-test"}


def shared_reference():
    """The tensors both sides write and expect."""
    return {
        "a.f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,
        "b.bf16": torch.tensor([1.0, -2.5, 0.15625, 2.0**127, -0.0], dtype=torch.bfloat16),
        "c.f16": torch.tensor([[0.5, -1.25], [65504.0, 6.103515625e-05]], dtype=torch.float16),
        "d.i32": torch.tensor([-3, 0, 7, 2147483647, -2147483648], dtype=torch.int32),
        "e.scalar": torch.tensor(42.0, dtype=torch.float32),
        "f.empty": torch.zeros((0, 3), dtype=torch.float32),
        "g.rank4": torch.arange(12, dtype=torch.float32).reshape(2, 1, 2, 3),
    }


def python_reference():
    """What `write` produces: the shared tensors plus an I64 one shardlm lists but cannot view."""
    t = shared_reference()
    t["h.i64"] = torch.tensor([1, -2, 1 << 40], dtype=torch.int64)
    return t


def _bits(t):
    """The tensor's bytes as uint8, so comparisons are bitwise (-0.0 != 0.0, NaN payloads count)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def verify(path):
    """Problems found comparing `path` with shared_reference(); empty when it matches."""
    got, metadata = load(path, with_metadata=True)
    want = shared_reference()
    problems = []
    if set(got) != set(want):
        problems.append(f"names {sorted(got)} != {sorted(want)}")
    for name in sorted(set(got) & set(want)):
        g, w = got[name], want[name]
        if g.dtype != w.dtype or list(g.shape) != list(w.shape):
            problems.append(f"{name}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}")
        elif not torch.equal(_bits(g), _bits(w)):
            problems.append(f"{name}: values {g.tolist()} != {w.tolist()}")
    if metadata != SHARED_METADATA:
        problems.append(f"metadata {metadata} != {SHARED_METADATA}")
    # What shardlm promises about its own files: a padded header and aligned tensors.
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    if n % 8:
        problems.append(f"header length {n} is not a multiple of 8")
    for name, entry in header.items():
        if name != "__metadata__" and entry["data_offsets"][0] % _element_size(_DTYPES[entry["dtype"]]):
            problems.append(f"{name}: data offset {entry['data_offsets'][0]} not aligned")
    return problems


def main(argv):
    if len(argv) == 3 and argv[1] == "write":
        save(argv[2], python_reference(), SHARED_METADATA)
        print("OK")
        return 0
    if len(argv) in (3, 4) and argv[1] in ("verify", "check"):
        problems = verify(argv[2])
        if problems:
            print(f"{argv[2]}: " + "; ".join(problems))
            return 1
        if argv[1] == "check":
            if len(argv) != 4:
                print(__doc__)
                return 2
            save(argv[3], python_reference(), SHARED_METADATA)
        print("OK")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
