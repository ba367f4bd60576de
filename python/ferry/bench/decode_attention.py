"""Attention of one new token per sequence over a long past, split along the
past as serving engines' decode kernels do ("flash decoding"), for the
end-to-end KV benchmark's one-token steps.

transformers' sdpa runs one block per query head here: on a 32K-token past
that leaves most of an H200's SMs idle, and on KV laid out as pages of
[tokens, heads, dim] (vLLM's layout, which the benchmark fetches into) it is
slower still. This kernel reads K and V in place through their strides,
each element once per KV head (the query heads that share it are computed
together), in blocks spread over the whole GPU, and merges the blocks'
partial softmaxes with a few small torch operations.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_N = 64  # past tokens per inner step


@triton.jit
def _partial(
    q_ptr, k_ptr, v_ptr, acc_ptr, m_ptr, l_ptr,
    past, chunk, scale,
    sq_b, sq_h, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    kv_heads: tl.constexpr, group: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
    BLOCK: tl.constexpr, splits: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)  # batch * kv_heads + kv head
    s = tl.program_id(1)  # which part of the past
    b = bh // kv_heads
    h = bh % kv_heads
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    q_rows = h * group + g
    q = tl.load(q_ptr + b * sq_b + q_rows[:, None] * sq_h + d[None, :], mask=(g < group)[:, None], other=0.0)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    start = s * chunk
    end = tl.minimum(start + chunk, past)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    for t0 in range(start, end, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        live = t < end
        k = tl.load(k_base + t[:, None] * sk_t + d[None, :], mask=live[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k)) * scale
        sc = tl.where(live[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + t[:, None] * sv_t + d[None, :], mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = (bh * splits + s) * G_PAD + g
    tl.store(acc_ptr + out[:, None] * D + d[None, :], acc)
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)


def decode_attention(torch, q, k, v, scale: float, sms: int):
    """q [batch, heads, 1, d]; k, v [batch, kv heads, past, d] (any strides,
    the last one 1); query head i uses KV head i // (heads / kv heads).
    Returns [batch, 1, heads, d] in q's dtype, as transformers' attention
    functions do."""
    b, heads, _, dim = q.shape
    kv_heads, past = k.shape[1], k.shape[2]
    group = heads // kv_heads
    if k.stride(-1) != 1 or v.stride(-1) != 1 or dim & (dim - 1) or dim < 16:
        raise ValueError(
            f"decode_attention: needs a power-of-two head dim >= 16 and unit last strides (dim {dim})"
        )
    g_pad = max(16, triton.next_power_of_2(group))  # tl.dot's smallest tile
    want = max(1, (4 * sms) // (b * kv_heads))  # about four blocks per SM
    chunk = max(BLOCK_N, triton.cdiv(triton.cdiv(past, want), BLOCK_N) * BLOCK_N)
    splits = triton.cdiv(past, chunk)
    q2 = q.reshape(b, heads, dim)
    f32 = dict(dtype=torch.float32, device=q.device)
    acc = torch.empty((b * kv_heads, splits, g_pad, dim), **f32)
    m = torch.empty((b * kv_heads, splits, g_pad), **f32)
    l_ = torch.empty((b * kv_heads, splits, g_pad), **f32)
    _partial[(b * kv_heads, splits)](
        q2, k, v, acc, m, l_, past, chunk, scale,
        q2.stride(0), q2.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        kv_heads=kv_heads, group=group, G_PAD=g_pad, D=dim, BLOCK=BLOCK_N, splits=splits,
    )  # fmt: skip
    top = m.amax(dim=1, keepdim=True)
    w = torch.exp(m - top)  # a part with no tokens has m = -inf: weight 0
    num = (acc * w.unsqueeze(-1)).sum(dim=1)  # [b * kv heads, g_pad, d]
    den = (l_ * w).sum(dim=1).unsqueeze(-1)
    out = (num / den)[:, :group].to(q.dtype)  # [b * kv heads, group, d]
    return out.reshape(b, 1, heads, dim)
