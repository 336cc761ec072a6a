"""The two token mixers of MALA: magnitude-aware linear attention and softmax attention.

Both share one skeleton (:class:`GatedAttention`); they differ only in the operator that turns per-head q, k, v into
the attention result, :func:`~mala_mm.ops.mala_attention.mala_attention` or
:func:`~mala_mm.ops.softmax_attention.softmax_attention`, each of which runs its torch operators or its Triton
kernels as ``impl`` selects.
"""
from typing import Optional, Tuple

from torch import Tensor, nn

from ...ops.conv2d import conv1x1_chunks
from ...ops.depthwise import gated_depthwise_conv
from ...ops.dispatch import uses_triton
from ...ops.mala_attention import mala_attention
from ...ops.rope import RotaryTables, rotate_qk, split_heads
from ...ops.softmax_attention import softmax_attention
from ...ops.weight_casts import low_precision
from .conv import Conv2d
from .rope import rope_head_dims


class QKVOProjection(Conv2d):
    """The 1x1 conv from (B, C, H, W) to the queries, keys, values and output gate, four (B, C, H, W) maps.

    One conv of 4C output channels (as released). Where the Triton kernels run (``impl``, see
    :func:`~mala_mm.ops.dispatch.uses_triton`), which read strided maps in place, it runs as one conv and the maps are
    channel slices of its output. Elsewhere it runs as four convs over views of its weight, so that each map comes out
    dense: the torch operators run elementwise ops on strided views several times slower
    (:func:`~mala_mm.ops.conv2d.conv1x1_chunks`, whose backward is one conv's).
    """

    def __init__(self, embed_dims: int, impl: str = 'torch'):
        super().__init__(embed_dims, 4 * embed_dims, 1)
        self.impl = impl

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        if uses_triton(self.impl, x):
            return tuple(self.one_map(x).chunk(4, dim=1))
        return conv1x1_chunks(x, low_precision(self.weight), low_precision(self.bias), 4)

    def one_map(self, x: Tensor) -> Tensor:
        """The one conv's (B, 4C, H, W) output."""
        return super().forward(x)


class GatedLePE(Conv2d):
    """LePE, the depth-wise 5x5 conv of v, with the attention result added and the gate applied:
    ``(y + LePE(v)) * o`` (:func:`~mala_mm.ops.depthwise.gated_depthwise_conv`)."""

    def __init__(self, embed_dims: int, impl: str = 'torch'):
        super().__init__(embed_dims, embed_dims, 5, padding=2, groups=embed_dims)
        self.impl = impl

    def forward(self, v: Tensor, y: Tensor, o: Tensor) -> Tensor:
        """v, y, o: (B, C, H, W). Returns (B, C, H, W), channels-last."""
        return gated_depthwise_conv(y, v, o, self.weight, self.bias, self.impl)


class GatedAttention(nn.Module):
    """The attention skeleton shared by both kinds.

    ``qkvo`` projects (B, C, H, W) to q, k, v and an output gate o (C channels each, channels head-major);
    the result Y of :meth:`attend` leaves as ``proj((Y + LePE(v)) * o)``, with LePE a depth-wise 5x5 conv.

    Args:
        embed_dims: C.
        num_heads: h; C / h must be a multiple of 4 (2-D RoPE splits each head into rows and columns).
        impl: the operators' implementation, 'auto', 'triton' or 'torch' (:mod:`mala_mm.ops.dispatch`; the
            backbone checks it).
    """

    def __init__(self, embed_dims: int, num_heads: int, impl: str = 'auto'):
        super().__init__()
        rope_head_dims(embed_dims, num_heads, f'{type(self).__name__}: ')
        self.impl = impl
        self.num_heads = num_heads
        self.qkvo = QKVOProjection(embed_dims, impl)
        self.lepe = GatedLePE(embed_dims, impl)
        self.proj = Conv2d(embed_dims, embed_dims, 1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables]) -> Tensor:
        """(B, h, N, d) q, k, v to the (B, h, N, d) attention result."""
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, C, H, W) to (B, h, N, d), tokens row-major; a view where x is channels-last."""
        return split_heads(x, self.num_heads)

    def forward(self, x: Tensor, rope: Optional[RotaryTables] = None) -> Tensor:
        """x: (B, C, H, W); rope: the (H W, C / h) tables of the stage's :class:`RoPE2d`, or None.
        Returns (B, C, H, W)."""
        q, k, v, o = self.qkvo(x)
        return self.leave(self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), rope), v, o)

    def leave(self, y: Tensor, v: Tensor, o: Tensor) -> Tensor:
        """The (B, h, N, d) attention result y with v's and o's (B, C, H, W) maps to the (B, C, H, W) output."""
        batch, channels, height, width = v.shape
        y = y.transpose(1, 2).reshape(batch, height, width, channels).permute(0, 3, 1, 2)  # channels-last
        return self.proj(self.lepe(v, y, o))


class MALAttention(GatedAttention):
    """Magnitude-aware linear attention (:func:`mala_attention`) in the gated skeleton."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables]) -> Tensor:
        return mala_attention(q, k, v, rope, impl=self.impl)


class SoftmaxAttention(GatedAttention):
    """Softmax attention (:func:`softmax_attention`) in the gated skeleton. Where the Triton kernels run, q and k
    are rotated in place in the projection's map (:func:`~mala_mm.ops.rope.rotate_qk`): the backward keeps that map
    for v and o, and would keep rotated copies of q and k beside it."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables]) -> Tensor:
        return softmax_attention(q, k, v, rope)

    def forward(self, x: Tensor, rope: Optional[RotaryTables] = None) -> Tensor:
        if rope is None or not uses_triton(self.impl, x):
            return super().forward(x, rope)
        q, k, v, o = rotate_qk(self.qkvo.one_map(x), rope, self.num_heads, self.impl)
        return self.leave(softmax_attention(q, k, self.split_heads(v)), v, o)
