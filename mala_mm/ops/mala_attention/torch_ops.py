"""Magnitude-aware linear attention in torch operators: what the CPU runs, and what compiled, traced and exported
graphs record."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rope import RotaryTables, apply_rope
from ..torch_compat import autocast_dtype, autocast_enabled

LOW_PRECISION = (torch.float16, torch.bfloat16)


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                   eps: float = 1e-6) -> Tensor:
    """:func:`~mala_mm.ops.mala_attention.mala_attention` in torch operators, O(N d^2): the scores' factor ``s / N``
    moved from KV onto beta (N values, not d^2), and only the two matmuls of ``q~ KV`` in low precision (see
    :func:`low_precision_product`)."""
    num_tokens, head_dims = q.shape[-2:]
    s = head_dims ** -0.5
    out_dtype, matmul_dtype = v.dtype, matmul_dtype_of(v)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, v))
        # q and k made dense (a copy only where a stage has several heads): for a strided input, the strides torch
        # assumes for elu's gradient while compiling differ from those its kernel gives, and the compiled backward
        # then fails on a view
        phi_q, phi_k = F.elu(q.contiguous()) + 1, F.elu(k.contiguous()) + 1
        z = s * (phi_q @ phi_k.mean(-2, keepdim=True).transpose(-2, -1))
        beta = 1 + 1 / (z + eps)
        if rope is not None:
            phi_q, phi_k = apply_rope(phi_q, rope), apply_rope(phi_k, rope)
        # beta_i q~_i KV with KV's factor s / N moved onto beta (N values, not N d), then - gamma_i sum_j v_j
        y = (beta * (s / num_tokens)) * low_precision_product(phi_q, phi_k, v, matmul_dtype)
        y = y.addcmul_(z, v.mean(-2, keepdim=True), value=-1)                               # gamma_i N = z_i
    return y.to(out_dtype)


def matmul_dtype_of(x: Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` runs in: autocast's where autocast is on and applies to x, else x's own."""
    device = x.device.type
    if x.dtype in (torch.float32, *LOW_PRECISION) and autocast_enabled(device):
        return autocast_dtype(device)
    return x.dtype


def low_precision_product(q: Tensor, k: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
    """``q @ (k^T @ v)`` with both matmuls in ``dtype``, returned in the (fp32 or fp64) dtype of the inputs.

    In fp16 and bf16 the operands are first divided by powers of two that bring them to about unit size (per
    query, per head of keys, per value channel; v also by N^1/2, so that the sum over N tokens in ``k^T v`` stays
    below N^1/2) and the product is scaled back in fp32: fp16 neither overflows nor underflows in between, and
    powers of two are exact, so nothing else changes. The normaliser ``beta`` amplifies any error of ``z`` where z
    is small, which is why z, beta and phi stay in fp32 (``elu(x) + 1`` in bf16 is 0 below about -6 where it
    should be ``e^x``).
    """
    if dtype not in LOW_PRECISION:
        return q.to(dtype) @ (k.to(dtype).transpose(-2, -1) @ v.to(dtype))
    q_unit = power_of_two_above(q.abs().amax(-1, keepdim=True))
    k_unit = power_of_two_above(k.abs().amax((-2, -1), keepdim=True))
    v_unit = power_of_two_above(v.abs().amax(-2, keepdim=True) * k.shape[-2] ** 0.5)
    q, k, v = (q / q_unit).to(dtype), (k / k_unit).to(dtype), (v / v_unit).to(dtype)
    return (q @ (k.transpose(-2, -1) @ v)).to(q_unit.dtype) * (q_unit * k_unit) * v_unit


def power_of_two_above(x: Tensor) -> Tensor:
    """A power of two from x to about 2x (1 where x is 0): dividing by it is exact in every float format.

    ``frexp`` would give it directly, but ONNX has no operator for it; ``log2`` and ``exp2`` of integers are exact.
    """
    x = x.detach()
    return torch.where(x > 0, torch.exp2(torch.floor(torch.log2(x)) + 1), torch.ones_like(x))
