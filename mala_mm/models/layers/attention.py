"""The two token mixers of MALA: magnitude-aware linear attention and softmax attention.

Both share one skeleton (:class:`GatedAttention`); they differ only in the function that turns per-head
q, k, v into the attention result, :func:`mala_attention` or :func:`softmax_attention`. MALA's has a second
implementation, fused into Triton kernels (:mod:`.mala_triton`), which ``attn_impl`` selects; with it, the
softmax stages rotate q and k in one Triton kernel (:mod:`.rope_triton`) and both kinds project q, k, v, o in one
conv whose four outputs they read in place.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ops.torch_compat import autocast_dtype, autocast_enabled, is_compiling, is_exporting
from ...ops.weight_casts import low_precision
from .conv import Conv2d
from .rope import RotaryTables, apply_rope, rope_head_dims

try:
    from . import mala_triton, rope_triton
except ImportError:  # Triton is optional: without it the torch implementation serves every device
    mala_triton = rope_triton = None

LOW_PRECISION = (torch.float16, torch.bfloat16)
# attn_impl: 'triton' the fused kernels, 'torch' the formula in torch operators, 'auto' the fused kernels for
# CUDA tensors where Triton is installed and the torch operators elsewhere
ATTENTION_IMPLS = ('auto', 'triton', 'torch')


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                   eps: float = 1e-6) -> Tensor:
    """Magnitude-aware linear attention in O(N d^2).

    With the kernel ``phi(x) = elu(x) + 1``, ``s = d^-1/2`` and RoPE applied after the kernel
    (``q~ = RoPE(phi(q))``, ``k~ = RoPE(phi(k))``)::

        z_i    = s phi(q_i) . mean_j phi(k_j)          (before RoPE)
        beta_i = 1 + 1 / (z_i + eps),   gamma_i = z_i / N
        KV     = s / N  sum_j k~_j^T v_j               (d x d per head)
        Y_i    = beta_i q~_i KV - gamma_i sum_j v_j

    This is the effective score ``beta_i s_ij - gamma_i`` with ``s_ij = s q~_i . k~_j / N`` applied to v, without
    forming the N x N matrix; a larger ``|phi(q_i)|`` gives a spikier row. The rows sum to one when RoPE is the
    identity. Only the two matmuls of ``q~ KV`` run in low precision (see :func:`_low_precision_product`).

    Args:
        q, k, v: (B, h, N, d) per-head projections.
        rope: the (N, d) tables of :meth:`RoPE2d.tables`, or None for no rotation.
        eps: keeps ``1 / z`` finite.

    Returns:
        (B, h, N, d) in the dtype of v.
    """
    num_tokens, head_dims = q.shape[-2:]
    s = head_dims ** -0.5
    out_dtype, matmul_dtype = v.dtype, _matmul_dtype(v)
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
        y = (beta * (s / num_tokens)) * _low_precision_product(phi_q, phi_k, v, matmul_dtype)
        y = y.addcmul_(z, v.mean(-2, keepdim=True), value=-1)                               # gamma_i N = z_i
    return y.to(out_dtype)


def _matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` runs in: autocast's where autocast is on and applies to x, else x's own."""
    device = x.device.type
    if x.dtype in (torch.float32, *LOW_PRECISION) and autocast_enabled(device):
        return autocast_dtype(device)
    return x.dtype


def _low_precision_product(q: Tensor, k: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
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
    q_unit = _power_of_two_above(q.abs().amax(-1, keepdim=True))
    k_unit = _power_of_two_above(k.abs().amax((-2, -1), keepdim=True))
    v_unit = _power_of_two_above(v.abs().amax(-2, keepdim=True) * k.shape[-2] ** 0.5)
    q, k, v = (q / q_unit).to(dtype), (k / k_unit).to(dtype), (v / v_unit).to(dtype)
    return (q @ (k.transpose(-2, -1) @ v)).to(q_unit.dtype) * (q_unit * k_unit) * v_unit


def _power_of_two_above(x: Tensor) -> Tensor:
    """A power of two from x to about 2x (1 where x is 0): dividing by it is exact in every float format.

    ``frexp`` would give it directly, but ONNX has no operator for it; ``log2`` and ``exp2`` of integers are exact.
    """
    x = x.detach()
    return torch.where(x > 0, torch.exp2(torch.floor(torch.log2(x)) + 1), torch.ones_like(x))


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                      rotate_in_triton: bool = False) -> Tensor:
    """``softmax(d^-1/2 q~ k~^T) v`` on RoPE-rotated raw q, k; fused kernels, no N x N matrix where available.

    Args:
        q, k, v: (B, h, N, d); rope: (N, d) tables from :meth:`RoPE2d.tables`, or None.
        rotate_in_triton: rotate q and k in one Triton kernel (:func:`.rope_triton.rotate_pair`) instead of
            :func:`apply_rope`.
    """
    if rope is not None:
        q, k = rope_triton.rotate_pair(q, k, rope) if rotate_in_triton else (apply_rope(q, rope), apply_rope(k, rope))
    return F.scaled_dot_product_attention(q, k, v)


class QKVOProjection(Conv2d):
    """The 1x1 conv from (B, C, H, W) to the queries, keys, values and output gate, four (B, C, H, W) maps.

    One conv of 4C output channels (as released). Where the Triton kernels read q, k and v, it runs as one conv and
    the maps are channel slices of its output (``as_views``): one launch where autocast adds a cast of x to each
    conv. Elsewhere it runs as four convs over views of its weight, so that each map comes out dense: the torch
    operators run elementwise ops on strided views several times slower.
    """

    def __init__(self, embed_dims: int):
        super().__init__(embed_dims, 4 * embed_dims, 1)

    def forward(self, x: Tensor, as_views: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        if as_views:
            return tuple(super().forward(x).chunk(4, dim=1))
        weights, biases = low_precision(self.weight).chunk(4), low_precision(self.bias).chunk(4)
        return tuple(self._conv_forward(x, weight, bias) for weight, bias in zip(weights, biases))


def check_attn_impl(attn_impl: str, where: str, error=ValueError) -> str:
    """``attn_impl`` if it is one of ATTENTION_IMPLS that this installation can run, else ``error`` saying why."""
    if attn_impl not in ATTENTION_IMPLS:
        raise error(f'{where}attn_impl must be one of {ATTENTION_IMPLS}, got {attn_impl!r}')
    if attn_impl == 'triton' and mala_triton is None:
        raise error(f"{where}attn_impl='triton' needs Triton (pip install triton), which is not installed")
    return attn_impl


def uses_triton(attn_impl: str, x: Tensor) -> bool:
    """Whether the attention of ``x`` runs in the Triton kernels. Traced, exported and compiled graphs take the
    torch operators, which they can record and the compiler fuses itself."""
    if attn_impl == 'torch' or torch.jit.is_tracing() or is_compiling() or is_exporting():
        return False
    if attn_impl == 'auto':
        return mala_triton is not None and x.is_cuda and x.dtype in (torch.float32, *LOW_PRECISION)
    if x.dtype not in (torch.float32, *LOW_PRECISION):
        raise TypeError(f"attn_impl='triton' takes fp32, bf16 or fp16 features, got {x.dtype}")
    if not (x.is_cuda or mala_triton.INTERPRETED):
        raise RuntimeError(f"attn_impl='triton' runs on CUDA tensors, got {x.device.type} ones (Triton's "
                           f"interpreter runs it on the CPU where TRITON_INTERPRET=1 is set before import)")
    return True


class GatedAttention(nn.Module):
    """The attention skeleton shared by both kinds.

    ``qkvo`` projects (B, C, H, W) to q, k, v and an output gate o (C channels each, channels head-major);
    the result Y of :meth:`attend` leaves as ``proj((Y + LePE(v)) * o)``, with LePE a depth-wise 5x5 conv.

    Args:
        embed_dims: C.
        num_heads: h; C / h must be a multiple of 4 (2-D RoPE splits each head into rows and columns).
        attn_impl: one of ATTENTION_IMPLS.
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_impl: str = 'auto'):
        super().__init__()
        rope_head_dims(embed_dims, num_heads, f'{type(self).__name__}: ')
        self.attn_impl = check_attn_impl(attn_impl, f'{type(self).__name__}: ')
        self.num_heads = num_heads
        self.qkvo = QKVOProjection(embed_dims)
        self.lepe = Conv2d(embed_dims, embed_dims, 5, padding=2, groups=embed_dims)
        self.proj = Conv2d(embed_dims, embed_dims, 1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables], fused: bool) -> Tensor:
        """(B, h, N, d) q, k, v to the (B, h, N, d) attention result, in the Triton kernels where ``fused``."""
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, C, H, W) to (B, h, N, d), tokens row-major; a view where x is channels-last."""
        batch, _, height, width = x.shape
        return x.permute(0, 2, 3, 1).reshape(batch, height * width, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: Tensor, rope: Optional[RotaryTables] = None) -> Tensor:
        """x: (B, C, H, W); rope: the (H W, C / h) tables of the stage's :class:`RoPE2d`, or None.
        Returns (B, C, H, W)."""
        batch, channels, height, width = x.shape
        fused = uses_triton(self.attn_impl, x)
        q, k, v, o = self.qkvo(x, as_views=fused)
        y = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), rope, fused)
        y = y.transpose(1, 2).reshape(batch, height, width, channels).permute(0, 3, 1, 2)  # channels-last
        return self.proj((y + self.lepe(v)) * o)


class MALAttention(GatedAttention):
    """Magnitude-aware linear attention (:func:`mala_attention`) in the gated skeleton."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables], fused: bool) -> Tensor:
        return (mala_triton.fused_mala_attention if fused else mala_attention)(q, k, v, rope)


class SoftmaxAttention(GatedAttention):
    """Softmax attention (:func:`softmax_attention`) in the gated skeleton."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables], fused: bool) -> Tensor:
        return softmax_attention(q, k, v, rope, rotate_in_triton=fused)
