#!/usr/bin/python3
"""Evidence for each place where PyTorch 1.13 and multihead disagree on purpose
(docs/parity.md quotes this script's output). Run: /usr/bin/python3 tests/parity/torch113_quirks.py

Each check prints what 1.13 does and what the additive / documented semantics
give, on one small float64 example (E=4, H=2, L=3, S=5, B=2).
"""
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")
torch.manual_seed(0)
E, H, L, S, B = 4, 2, 3, 5, 2


def module(**kw):
    m = torch.nn.MultiheadAttention(E, H, **kw).double().eval()
    with torch.no_grad():  # no zero biases: every path must use them
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
    return m


def additive_weights(m, q, k, attn_add):
    """The documented semantics: one additive (B*H, L, S) mask."""
    return F.multi_head_attention_forward(
        q, k, k, E, H, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.0,
        m.out_proj.weight, m.out_proj.bias, training=False, attn_mask=attn_add)


def show(title, ours, theirs, note):
    print(f"== {title}")
    print(f"   1.13:      {[round(x, 4) for x in theirs.tolist()]}")
    print(f"   additive:  {[round(x, 4) for x in ours.tolist()]}")
    print(f"   -> {note}\n")


def main():
    print(f"torch {torch.__version__}\n")
    m = module()
    q = torch.randn(L, B, E, dtype=torch.float64)
    k = torch.randn(S, B, E, dtype=torch.float64)
    kpm = torch.zeros(B, S, dtype=torch.float64)
    kpm[0, 1] = -0.5  # a soft penalty on key 1 of batch 0
    kpm_add = kpm.view(B, 1, 1, S).expand(B, H, L, S).reshape(B * H, L, S)

    # 1. float key_padding_mask + float attn_mask
    am = torch.zeros(L, S, dtype=torch.float64)
    with torch.no_grad():
        _, w113 = m(q, k, k, key_padding_mask=kpm, attn_mask=am)
        _, w_nokpm = m(q, k, k, attn_mask=am)
        _, w_add = additive_weights(m, q, k, am + kpm_add)
    show("float key_padding_mask with float attn_mask: weights of batch 0, query 0",
         w_add[0, 0], w113[0, 0],
         "1.13 calls attn_mask.masked_fill(float_kpm, -inf); masked_fill with a float mask "
         f"fills nothing here, so the key_padding_mask is ignored "
         f"(max |w(kpm) - w(no kpm)| = {float((w113 - w_nokpm).abs().max()):.1e})")
    print("   masked_fill with a float mask:", torch.zeros(3).masked_fill(torch.tensor([0.0, -0.5, 1.0]), 7.0).tolist(),
          "\n")

    # 2. float key_padding_mask + bool attn_mask
    amb = torch.zeros(L, S, dtype=torch.bool)
    with torch.no_grad():
        _, w113 = m(q, k, k, key_padding_mask=kpm, attn_mask=amb)
    show("float key_padding_mask with bool attn_mask: weights of batch 0, query 0",
         w_add[0, 0], w113[0, 0],
         "1.13 logical_or's the masks: the -0.5 penalty becomes 'never attend' (weight exactly 0)")

    # 3. float key_padding_mask on the eval fast path
    mf = module(batch_first=True)
    x = torch.randn(B, S, E, dtype=torch.float64)
    with torch.no_grad():
        fast = mf(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
        slow = mf(x, x.clone(), x.clone(), key_padding_mask=kpm, need_weights=False)[0]
    show("float key_padding_mask on the eval fast path (batch_first, self-attention, need_weights=False): "
         "output of batch 0, token 0", slow[0, 0], fast[0, 0],
         "torch._native_multi_head_attention converts the float mask to bool (nonzero = masked); "
         f"max |fast - F path| = {float((fast - slow).abs().max()):.3f}")

    # 4. fully masked query rows
    kpmb = torch.zeros(B, S, dtype=torch.bool)
    kpmb[1, :] = True  # batch 1: every key padded
    with torch.no_grad():
        out, w = m(q, k, k, key_padding_mask=kpmb)
    print("== every key of batch 1 masked (bool key_padding_mask)")
    print(f"   1.13 output[0, 1]:  {out[0, 1].tolist()}")
    print(f"   1.13 weights[1, 0]: {w[1, 0].tolist()}")
    print(f"   out_proj.bias:      {[round(v, 4) for v in m.out_proj.bias.tolist()]}")
    print("   -> multihead --masked-rows zeros (default): weights 0, attention output 0, so the token's output is "
          "out_proj.bias; --masked-rows nan reproduces 1.13\n")

    # 5. is_causal
    print("== is_causal")
    try:
        m(q, k, k, is_causal=True)
        print("   1.13 accepts is_causal")
    except TypeError as e:
        print(f"   1.13: TypeError: {e}")
    print("   -> multihead --is-causal masks key j > query i (over the S keys; bias_k and zero-attention columns "
          "stay visible); the parity reference passes the same thing as an explicit additive attn_mask\n")

    # 6. uint8 key_padding_mask
    print("== uint8 key_padding_mask")
    try:
        m(q, k, k, key_padding_mask=kpmb.to(torch.uint8))
        print("   1.13 accepts a uint8 key_padding_mask")
    except AssertionError as e:
        print(f"   1.13: AssertionError: {e}")
    print("   -> multihead reads a uint8 .npy mask as boolean for both masks "
          "(1.13 accepts uint8 only for attn_mask, with a deprecation warning)")


if __name__ == "__main__":
    main()
