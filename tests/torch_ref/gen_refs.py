#!/usr/bin/python3
"""Writes PyTorch reference cases for the op parity tests.

Usage: /usr/bin/python3 tests/torch_ref/gen_refs.py OUTDIR [OP ...]

Every module ref_<op>.py beside this file defines OP (the op's name) and cases(), a generator of
(case_name, arrays, params): arrays maps names to torch tensors (inputs and expected outputs, computed
by PyTorch, gradients by autograd), params maps names to JSON scalars. Each case is written to
OUTDIR/<op>/<case_name>/ as one .npy per array plus params.json. float32 is stored as <f4, integer
tensors as <i4, bfloat16 as its bit pattern <u2. The C++ side reads them (tests/testing.h).
"""
import importlib
import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def to_numpy(t):
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float64, torch.float16):
        return t.float().numpy()
    if t.dtype in (torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool):
        return t.to(torch.int32).numpy()
    return t.numpy()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    wanted = set(sys.argv[2:])
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    sys.path.insert(0, HERE)
    modules = sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("ref_") and f.endswith(".py"))
    total = 0
    for name in modules:
        mod = importlib.import_module(name)
        if wanted and mod.OP not in wanted:
            continue
        op_dir = os.path.join(out, mod.OP)
        shutil.rmtree(op_dir, ignore_errors=True)
        torch.manual_seed(1234)
        count = 0
        for case_name, arrays, params in mod.cases():
            case_dir = os.path.join(op_dir, case_name)
            os.makedirs(case_dir, exist_ok=True)
            for key, value in arrays.items():
                np.save(os.path.join(case_dir, key + ".npy"), to_numpy(value))
            with open(os.path.join(case_dir, "params.json"), "w") as f:
                json.dump(params, f)
            count += 1
        if count == 0:
            sys.exit(f"{name}: produced no cases")
        total += count
        print(f"{mod.OP}: {count} cases")
    print(f"wrote {total} reference cases to {out}")


if __name__ == "__main__":
    main()
