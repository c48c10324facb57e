"""The CUDA kernels a recording on the CPU must see: within ``route_cuda_kernels()``,
``F.scaled_dot_product_attention`` calls the memory-efficient (fp32, or with a mask) or flash (fp16/bf16)
attention kernels and ``F.dropout`` calls ``native_dropout``, as PyTorch does on a GPU. Meta tensors have kernels
for these; on real CPU tensors the attention kernels are emulated with the math formula (``_emulated_table``: same
outputs, shapes and strides as the CUDA kernels; dropout inside attention is not applied on the CPU, see
``docs/recording.md``).
"""

from __future__ import annotations

import contextlib
import math

@contextlib.contextmanager
def route_cuda_kernels():
    """Within the block, ``F.scaled_dot_product_attention`` calls the CUDA attention kernels (flash for
    fp16/bf16 without a mask, memory-efficient otherwise) and ``F.dropout`` calls ``native_dropout``, as
    PyTorch does on a GPU; on meta/CPU it would pick the math path and ``bernoulli_`` instead."""
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _sdpa_cuda, _dropout_cuda
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def _dropout_cuda(input, p=0.5, training=True, inplace=False):
    import torch

    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input.mul_(0.0) if inplace else input * 0.0
    out = torch.ops.aten.native_dropout(input, p, True)[0]
    if inplace:
        return input.copy_(out)
    return out


def _sdpa_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                                  scale=scale)[0]
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:  # PyTorch turns boolean masks into an additive bias for these kernels
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
        shape = (query.shape[0], query.shape[-3], query.shape[-2], key.shape[-2])
        bias = bias.expand(shape)
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, need_lse, dropout_p,
                                                                  is_causal, scale=scale)[0]


# CPU emulation of the CUDA-only attention kernels: outputs shaped/strided as the kernels' meta functions say,
# filled by the math formula. Dropout inside attention is not applied (values only; the trace is unaffected).


def _bind(func, args, kwargs) -> dict:
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def _meta_shapes(func, args, kwargs):
    import torch
    from torch.utils._pytree import tree_map

    to_meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
    return func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))


def _materialise(meta_outs, values):
    import torch

    res = []
    for m, v in zip(meta_outs, values):
        if isinstance(m, torch.Tensor):
            t = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="cpu")
            if v is None:
                t.zero_()
            else:
                idx = tuple(slice(0, s) for s in v.shape)
                if m.dtype.is_floating_point and tuple(v.shape) != tuple(m.shape):
                    t.fill_(float("inf"))
                t[idx].copy_(v)
            res.append(t)
        else:
            res.append(m)
    return tuple(res)


def _math_attention(q, k, v, bias, is_causal, scale):
    import torch

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias.float()
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(s, -1)
    return p @ v.float(), torch.logsumexp(s, -1), p, scale


def _math_attention_backward(dout, q, k, v, bias, is_causal, scale):
    _, _, p, scale = _math_attention(q, k, v, bias, is_causal, scale)
    dout = dout.float()
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.float().transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k.float() * scale, ds.transpose(-2, -1) @ q.float() * scale, dv, ds


def _emu_efficient(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    o, lse, _, _ = _math_attention(a["query"], a["key"], a["value"], a["attn_bias"], a["is_causal"], a["scale"])
    return _materialise(meta, (o, lse if a["compute_log_sumexp"] else None, None, None))


def _emu_efficient_bwd(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    dq, dk, dv, ds = _math_attention_backward(a["grad_out_"], a["query"], a["key"], a["value"], a["attn_bias"],
                                              a["is_causal"], a["scale"])
    return _materialise(meta, (dq, dk, dv, ds if meta[3] is not None else None))


def _emu_flash(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    o, lse, _, _ = _math_attention(a["query"], a["key"], a["value"], None, a["is_causal"], a["scale"])
    return _materialise(meta, (o, lse) + (None,) * (len(meta) - 2))


def _emu_flash_bwd(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    dq, dk, dv, _ = _math_attention_backward(a["grad_out"], a["query"], a["key"], a["value"], None,
                                             a["is_causal"], a["scale"])
    return _materialise(meta, (dq, dk, dv))


def _emulated_table() -> dict:
    import torch

    ops = torch.ops.aten
    return {ops._scaled_dot_product_efficient_attention.default: _emu_efficient,
            ops._scaled_dot_product_efficient_attention_backward.default: _emu_efficient_bwd,
            ops._scaled_dot_product_flash_attention.default: _emu_flash,
            ops._scaled_dot_product_flash_attention_backward.default: _emu_flash_bwd}
