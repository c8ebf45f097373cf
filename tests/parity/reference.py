"""Float64 references for multi-head attention.

Two independent computations of the same function:
  - `torch_forward`: torch.nn.functional.multi_head_attention_forward (1.13),
    training=False. Not the module's forward: in eval mode 1.13 takes a fast
    path (torch._native_multi_head_attention) that turns a float
    key_padding_mask into a boolean one (docs/parity.md).
  - `mirror_forward`: the same steps written out with torch ops, line for
    line after F.multi_head_attention_forward, plus the masked-row policy:
    "nan" is PyTorch's behaviour (softmax over all -inf is NaN), "zeros" sets
    the weights of a fully masked query row to 0, so that head's attention
    output is 0. parity.py checks mirror_forward(policy="nan") against
    torch_forward on every configuration before trusting it.

All tensors here are batched and sequence-first: query (L, B, E),
key (S, B, Ek), value (S, B, Ev); masks are merged by the caller into one
additive (B*H, L, S) float64 mask (`merge_masks`).
Legend: B batch, L query length, S key length, E embed, H heads, D = E / H.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


def merge_masks(B, H, L, S, attn_mask=None, key_padding_mask=None, is_causal=False):
    """One additive float64 mask (B*H, L, S), or None when nothing is masked.

    attn_mask: numpy (L, S) or (B*H, L, S), bool (True = may not attend) or float
    (added). key_padding_mask: numpy (B, S), bool or float (added, PyTorch 2.x
    semantics). is_causal: key j > query i is masked. Everything is over the
    original S keys; the bias_k / zero-attention columns are appended later,
    visible (zero padding), exactly as F.multi_head_attention_forward pads.
    """
    if attn_mask is None and key_padding_mask is None and not is_causal:
        return None
    m = torch.zeros(B, H, L, S, dtype=torch.float64)
    if attn_mask is not None:
        a = torch.from_numpy(np.asarray(attn_mask))
        a = additive(a)
        m = m + (a.view(1, 1, L, S) if a.dim() == 2 else a.view(B, H, L, S))
    if key_padding_mask is not None:
        k = additive(torch.from_numpy(np.asarray(key_padding_mask)))
        m = m + k.view(B, 1, 1, S)
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool).triu(diagonal=1)
        m = m.masked_fill(causal.view(1, 1, L, S), float("-inf"))
    return m.reshape(B * H, L, S)


def additive(mask):
    if mask.dtype == torch.bool or mask.dtype == torch.uint8:
        return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask.bool(), float("-inf"))
    return mask.to(torch.float64)


def _t(p, name):
    v = p.get(name)
    return None if v is None else torch.from_numpy(np.asarray(v, dtype=np.float64))


def torch_forward(query, key, value, params, num_heads, add_zero_attn, attn_mask,
                  key_padding_mask=None, need_weights=True, average_attn_weights=True):
    """F.multi_head_attention_forward in float64. attn_mask/key_padding_mask are
    passed through unchanged (torch tensors or None)."""
    E = query.shape[-1]
    separate = "in_proj_weight" not in params
    out, w = F.multi_head_attention_forward(
        query, key, value, E, num_heads,
        _t(params, "in_proj_weight"), _t(params, "in_proj_bias"),
        _t(params, "bias_k"), _t(params, "bias_v"), add_zero_attn,
        0.0, _t(params, "out_proj.weight"), _t(params, "out_proj.bias"),
        training=False, key_padding_mask=key_padding_mask, need_weights=need_weights,
        attn_mask=attn_mask, use_separate_proj_weight=separate,
        q_proj_weight=_t(params, "q_proj_weight"), k_proj_weight=_t(params, "k_proj_weight"),
        v_proj_weight=_t(params, "v_proj_weight"), average_attn_weights=average_attn_weights)
    return out, w


def mirror_forward(query, key, value, params, num_heads, add_zero_attn, mask,
                   average_attn_weights=True, policy="nan"):
    """Returns (output (L, B, E), weights (B, L, S') or (B, H, L, S'))."""
    L, B, E = query.shape
    H = num_heads
    D = E // H
    p = {k: _t(params, k) for k in params}
    if "in_proj_weight" in p:
        w_q, w_k, w_v = p["in_proj_weight"].chunk(3)
    else:
        w_q, w_k, w_v = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
    if "in_proj_bias" in p:
        b_q, b_k, b_v = p["in_proj_bias"].chunk(3)
    else:
        b_q = b_k = b_v = None
    # in_projection: x Wᵀ + b, as F.linear
    q = F.linear(query, w_q, b_q)
    k = F.linear(key, w_k, b_k)
    v = F.linear(value, w_v, b_v)
    if "bias_k" in p:
        k = torch.cat([k, p["bias_k"].repeat(1, B, 1)])
        v = torch.cat([v, p["bias_v"].repeat(1, B, 1)])
        if mask is not None:
            mask = F.pad(mask, (0, 1))
    # split_heads: (L, B, E) -> (B*H, L, D)
    q = q.contiguous().view(L, B * H, D).transpose(0, 1)
    k = k.contiguous().view(k.shape[0], B * H, D).transpose(0, 1)
    v = v.contiguous().view(v.shape[0], B * H, D).transpose(0, 1)
    if add_zero_attn:
        zeros = torch.zeros(B * H, 1, D, dtype=torch.float64)
        k = torch.cat([k, zeros], dim=1)
        v = torch.cat([v, zeros], dim=1)
        if mask is not None:
            mask = F.pad(mask, (0, 1))
    S2 = k.shape[1]
    scores = torch.bmm(q / math.sqrt(D), k.transpose(1, 2))
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    if policy == "zeros":
        fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
        weights = weights.masked_fill(fully_masked, 0.0)
    elif policy != "nan":
        raise ValueError(policy)
    attn = torch.bmm(weights, v)
    # merge_heads + out_projection
    attn = attn.transpose(0, 1).contiguous().view(L * B, E)
    out = F.linear(attn, p["out_proj.weight"], p.get("out_proj.bias")).view(L, B, E)
    weights = weights.view(B, H, L, S2)
    if average_attn_weights:
        weights = weights.sum(dim=1) / H
    return out, weights


def fully_masked_rows(B, H, L, mask, S2_extra):
    """Number of (batch·head, query) rows whose every key is masked."""
    if mask is None or S2_extra > 0:
        return 0
    return int(torch.isneginf(mask).all(dim=-1).sum())
