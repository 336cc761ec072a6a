"""Magnitude-aware linear attention in torch operators: what the CPU runs, and what compiled, traced and exported
graphs record."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rope import RotaryTables
from ..rope.torch_ops import apply_rope, rotate_back
from ..torch_compat import autocast_dtype, autocast_enabled, in_graph

LOW_PRECISION = (torch.float16, torch.bfloat16)


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                   eps: float = 1e-6) -> Tensor:
    """:func:`~mala_mm.ops.mala_attention.mala_attention` in torch operators, O(N d^2): the scores' factor ``s / N``
    moved from KV onto beta (N values, not d^2), and only the two matmuls of ``q~ KV`` in low precision (see
    :func:`low_precision_product`).

    Where gradients flow in eager mode, the backward is written out (:class:`MALAttentionFunction`): it keeps q, k
    and v as given, not the fp32 features, scales and products that autograd would keep for each operator. Graphs
    (traced, compiled or exported) record the operators, and their compilers choose what to keep."""
    matmul_dtype = matmul_dtype_of(v)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) and not in_graph():
        cos, sin = (None, None) if rope is None else rope
        return MALAttentionFunction.apply(q, k, v, cos, sin, eps, matmul_dtype)
    return _forward(q, k, v, rope, eps, matmul_dtype)


def _forward(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables], eps: float, matmul_dtype: torch.dtype,
             with_terms: bool = False):
    """Y, and where ``with_terms`` also each query's z and ``1 / (z + eps)``, (..., N, 1), and the means of phi(k)
    and of v, (..., 1, d), fp32."""
    num_tokens, head_dims = q.shape[-2:]
    s = head_dims ** -0.5
    out_dtype = v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, v))
        # q and k made dense (a copy only where a stage has several heads): for a strided input, the strides torch
        # assumes for elu's gradient while compiling differ from those its kernel gives, and the compiled backward
        # then fails on a view
        phi_q, phi_k = F.elu(q.contiguous()) + 1, F.elu(k.contiguous()) + 1
        k_mean, v_mean = phi_k.mean(-2, keepdim=True), v.mean(-2, keepdim=True)
        z = s * (phi_q @ k_mean.transpose(-2, -1))
        inverse = 1 / (z + eps)
        if rope is not None:
            phi_q, phi_k = apply_rope(phi_q, rope), apply_rope(phi_k, rope)
        # beta_i q~_i KV with KV's factor s / N moved onto beta (N values, not N d), then - gamma_i sum_j v_j
        y = ((1 + inverse) * (s / num_tokens)) * low_precision_product(phi_q, phi_k, v, matmul_dtype)
        y = y.addcmul_(z, v_mean, value=-1).to(out_dtype)                               # gamma_i N = z_i
    return (y, z, inverse, k_mean, v_mean) if with_terms else y


class MALAttentionFunction(torch.autograd.Function):
    """:func:`mala_attention` with its backward written out in fp32 torch operators, from q, k and v, each query's z
    and ``1 / (z + eps)`` (two values a token) and the means of phi(k) and v alone.

    With ``phi(x) = elu(x) + 1``, ``q~ = R(phi(q))``, ``k~ = R(phi(k))``, ``KV = k~^T v``, ``c = s / N`` and the
    output ``Y = c (1 + 1 / (z + eps)) q~ KV - z mean(v)``, for the gradient G of Y, with ``A = G KV^T``
    (``G . q~ KV = q~ . A`` row by row)::

        dq~ = c (1 + 1 / (z + eps)) A,   -dz = G . mean(v) + c (q~ . A) / (z + eps)^2
        dKV = q~^T dP (dP = c (1 + 1 / (z + eps)) G),   dk~ = v dKV^T,   dv = k~ dKV - z^T G / N
        dphi(q) = R^T(dq~) + s dz mean(phi(k)),   dphi(k) = R^T(dk~) + c dz^T phi(q)
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], eps: float,
                matmul_dtype: torch.dtype) -> Tensor:
        y, *terms = _forward(q, k, v, None if cos is None else RotaryTables(cos, sin), eps, matmul_dtype,
                             with_terms=True)
        ctx.save_for_backward(q, k, v, cos, sin, *terms)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        q_in, k_in, v_in, cos, sin, z, inverse, k_mean, v_mean = ctx.saved_tensors
        num_tokens, head_dims = q_in.shape[-2:]
        s = head_dims ** -0.5
        c = s / num_tokens
        with torch.autocast(q_in.device.type, enabled=False):
            q, k, v, grad = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q_in, k_in, v_in, grad))
            elu_q, elu_k = F.elu(q), F.elu(k)
            phi_q, phi_k = elu_q + 1, elu_k + 1
            rotated_q, rotated_k = phi_q, phi_k
            if cos is not None:
                tables = RotaryTables(cos, sin)
                rotated_q, rotated_k = apply_rope(phi_q, tables), apply_rope(phi_k, tables)
            kv = rotated_k.transpose(-2, -1) @ v
            a = grad @ kv.transpose(-2, -1)
            scale = (1 + inverse).mul_(c)
            minus_d_z = torch.addcmul(grad @ v_mean.transpose(-2, -1), inverse.square(),
                                      (rotated_q * a).sum(-1, keepdim=True), value=c)
            d_kv = rotated_q.transpose(-2, -1) @ (scale * grad)
            d_rotated_q, d_rotated_k = a.mul_(scale), v @ d_kv.transpose(-2, -1)
            if cos is not None:
                d_rotated_q, d_rotated_k = rotate_back(d_rotated_q, tables), rotate_back(d_rotated_k, tables)
            d_phi_q = d_rotated_q.addcmul_(minus_d_z, k_mean, value=-s)
            d_phi_k = d_rotated_k.add_(minus_d_z.transpose(-2, -1) @ phi_q, alpha=-c)
            dv = (rotated_k @ d_kv).sub_(z.transpose(-2, -1) @ grad, alpha=1 / num_tokens)
            dq = torch.ops.aten.elu_backward(d_phi_q, 1.0, 1, 1, True, elu_q)
            dk = torch.ops.aten.elu_backward(d_phi_k, 1.0, 1, 1, True, elu_k)
        return dq.to(q_in.dtype), dk.to(k_in.dtype), dv.to(v_in.dtype), None, None, None, None


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
