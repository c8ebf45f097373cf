#!/usr/bin/python3
"""PyTorch 1.13's bf16 nn.MultiheadAttention on the precision cases.

Runs `TESTS --gtest_filter=PrecisionTorch*.Dump` (the cases, as JSON, into
WORKDIR), then for each forward case nn.MultiheadAttention(...).to(
torch.bfloat16) on CPU in eval mode with need_weights=False, writing its
output (widened to float32, the caller's layout) to torch_<i>.f32; for each
backward case (bcase_<i>.json) the same forward with autograd, then
out.backward(d_output), writing the gradients of the inputs and parameters
(widened to float32, in the case's gradient_names order) to
torch_grad_<i>.f32; then `TESTS --gtest_filter=PrecisionTorch*.Compare`,
which checks ours against them (tests/precision/test_precision.cpp and
test_precision_backward.cpp say how) and writes WORKDIR/errors.tsv and
WORKDIR/gradient_errors.tsv.

Usage: torch_bf16.py --tests multihead_precision_tests --workdir DIR
"""
import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import torch


def tensor(entry, dtype):
    return torch.tensor(entry["data"], dtype=torch.float64).reshape(entry["shape"]).to(dtype)


def build(case):
    """The case's bf16 module, inputs and masks (the forward and backward share it)."""
    bf = torch.bfloat16
    mha = torch.nn.MultiheadAttention(case["E"], case["H"], bias=case["bias"], add_bias_kv=case["add_bias_kv"],
                                      add_zero_attn=case["add_zero_attn"], kdim=case["kdim"], vdim=case["vdim"],
                                      batch_first=case["batch_first"])
    state = {name: tensor(case[name], torch.float64) for name in mha.state_dict() if name in case}
    missing = set(mha.state_dict()) - set(state)
    if missing:
        raise SystemExit(f"{case['name']}: parameters missing from the dump: {sorted(missing)}")
    mha.load_state_dict(state)
    mha = mha.to(bf).eval()
    q, k, v = (tensor(case[n], bf) for n in ("query", "key", "value"))
    L = q.shape[1] if case["batch_first"] and q.dim() == 3 else q.shape[0]
    S = k.shape[1] if case["batch_first"] and k.dim() == 3 else k.shape[0]
    attn_mask = None
    if "attn_mask_bool" in case:
        attn_mask = tensor(case["attn_mask_bool"], torch.float64) != 0
    elif "attn_mask_float" in case:
        attn_mask = tensor(case["attn_mask_float"], bf)
    if case["causal"]:
        # top-left: key j > i hidden; bottom-right: j > i + S - L
        shift = S - L if case.get("bottom_right") else 0
        hidden = torch.triu(torch.ones(L, S, dtype=torch.bool), 1 + shift)
        if attn_mask is None:
            attn_mask = hidden
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask | hidden
        else:
            attn_mask = attn_mask.masked_fill(hidden, float("-inf"))
    kpm = tensor(case["key_padding_mask_bool"], torch.float64) != 0 if "key_padding_mask_bool" in case else None
    return mha, (q, k, v), dict(key_padding_mask=kpm, need_weights=False, attn_mask=attn_mask)


def run_case(case):
    mha, (q, k, v), kwargs = build(case)
    with torch.no_grad():
        out, _ = mha(q, k, v, **kwargs)
    return out.to(torch.float32).numpy()


def run_backward_case(case):
    """The gradients, each widened to float32, in case["gradient_names"] order, concatenated."""
    mha, inputs, kwargs = build(case)
    q, k, v = (x.clone().requires_grad_(True) for x in inputs)
    out, _ = mha(q, k, v, **kwargs)
    out.backward(tensor(case["d_output"], torch.bfloat16))
    grads = {"query": q.grad, "key": k.grad, "value": v.grad}
    grads.update({name: p.grad for name, p in mha.named_parameters()})
    return np.concatenate([grads[n].to(torch.float32).numpy().ravel() for n in case["gradient_names"]])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    for old in glob.glob(str(work / "*")):
        os.remove(old)
    env = dict(os.environ, MULTIHEAD_PRECISION_TORCH_DIR=str(work))
    subprocess.run([args.tests, "--gtest_filter=PrecisionTorch*.Dump"], env=env, check=True)
    torch.set_num_threads(1)
    cases = sorted(glob.glob(str(work / "case_*.json")))
    for path in cases:
        case = json.load(open(path))
        i = pathlib.Path(path).stem.split("_")[1]
        np.ascontiguousarray(run_case(case), dtype=np.float32).tofile(work / f"torch_{i}.f32")
    backward = sorted(glob.glob(str(work / "bcase_*.json")))
    for path in backward:
        case = json.load(open(path))
        i = pathlib.Path(path).stem.split("_")[1]
        np.ascontiguousarray(run_backward_case(case), dtype=np.float32).tofile(work / f"torch_grad_{i}.f32")
    print(f"torch_bf16.py: PyTorch {torch.__version__} ran {len(cases)} forward and {len(backward)} backward "
          f"cases in bfloat16")
    return subprocess.run([args.tests, "--gtest_filter=PrecisionTorch*.Compare"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
