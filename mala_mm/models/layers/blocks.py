"""Building blocks of the MALA backbone: norms, stem, downsample, FFN, transformer block and stage.

Module and parameter names follow the released checkpoints so that their state dicts load unchanged.
"""
from typing import Callable, List, Optional, Sequence

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from torch import Tensor, nn

from ...ops.batch_norm_gelu import batch_norm_gelu
from ...ops.conv2d import channels_last_strides
from ...ops.depthwise import residual_depthwise_conv
from ...ops.residual import add_branch, layer_norm_2d
from ...ops.rope import RotaryTables
from .attention import MALAttention, SoftmaxAttention
from .conv import Conv2d
from .rope import RoPE2d

ATTENTION_KINDS = {'mala': MALAttention, 'softmax': SoftmaxAttention}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map (eps 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_2d(x, self.norm.weight, self.norm.bias, self.norm.eps)


class ConvStem(nn.Module):
    """Stride-4 stem: four 3x3 convs (strides 2, 1, 1, 2), each followed by a norm, GELU between them.

    (B, in_channels, H, W) -> (B, C, ceil(H / 4), ceil(W / 4)). Where a norm is a BatchNorm in training, it and its
    GELU run as one operator (:func:`~mala_mm.ops.batch_norm_gelu.batch_norm_gelu`), whose Triton path keeps the
    norm's input alone for the backward; SyncBN, which gathers its statistics across processes, runs as it is.
    """

    def __init__(self, in_channels: int, embed_dims: int, norm_cfg: dict, impl: str = 'auto'):
        super().__init__()
        mid = embed_dims // 2
        self.impl = impl
        layers = []
        for i, (c_in, c_out, stride) in enumerate(
                [(in_channels, mid, 2), (mid, mid, 1), (mid, mid, 1), (mid, embed_dims, 2)]):
            layers += [Conv2d(c_in, c_out, 3, stride, 1), build_norm_layer(norm_cfg, c_out)[1]]
            if i < 3:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        layers = self.proj
        for i in range(0, len(layers) - 2, 3):
            conv, norm, gelu = layers[i:i + 3]
            x = self._norm_gelu(norm, gelu, conv(x))
        return layers[-1](layers[-2](x))

    def _norm_gelu(self, norm: nn.Module, gelu: nn.Module, x: Tensor) -> Tensor:
        if not (type(norm) is nn.BatchNorm2d and norm.training and norm.affine and torch.is_grad_enabled()
                and x.numel() > x.shape[1]):
            return gelu(norm(x))
        momentum = norm.momentum
        if norm.track_running_stats:  # as the norm's own forward counts its batches
            norm.num_batches_tracked.add_(1)
            if momentum is None:
                momentum = 1 / float(norm.num_batches_tracked)
        return batch_norm_gelu(x, norm.weight, norm.bias, norm.running_mean, norm.running_var, momentum, norm.eps,
                               self.impl)


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv and a norm between stages: (B, C_in, H, W) -> (B, C_out, ceil(H/2), ceil(W/2))."""

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict):
        super().__init__()
        self.reduction = Conv2d(in_channels, out_channels, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1]

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.reduction(x))


class ResidualDWConv(Conv2d):
    """``a + DWConv(a)`` with ``a = x``, or ``a = GELU(x)`` where ``gelu``: a depth-wise conv (size-preserving, odd
    kernel) with its input added back (:func:`~mala_mm.ops.depthwise.residual_depthwise_conv`). The parameters are
    those of the plain conv, so the state dict is unchanged.

    Args:
        channels: C; kernel_size: k, odd.
        gelu: apply GELU first (the FFN's activation).
        impl: the operator's implementation (:mod:`mala_mm.ops.dispatch`).
    """

    def __init__(self, channels: int, kernel_size: int, gelu: bool = False, impl: str = 'auto'):
        super().__init__(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)
        self.gelu = gelu
        self.impl = impl
        centre_tap = channels_last_strides(torch.zeros_like(self.weight))
        centre_tap[..., kernel_size // 2, kernel_size // 2] = 1
        self.register_buffer('centre_tap', centre_tap, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return residual_depthwise_conv(x, self.weight, self.bias, self.gelu, self.centre_tap, self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + (', gelu=True' if self.gelu else '')


class ConvFFN(nn.Module):
    """conv1x1 (C -> hidden), GELU and a residual depth-wise 3x3 conv, conv1x1 (hidden -> C)."""

    def __init__(self, embed_dims: int, hidden_dims: int, impl: str = 'auto'):
        super().__init__()
        self.fc1 = Conv2d(embed_dims, hidden_dims, 1)
        self.dwconv = ResidualDWConv(hidden_dims, 3, gelu=True, impl=impl)
        self.fc2 = Conv2d(hidden_dims, embed_dims, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dwconv(self.fc1(x)))


class MALABlock(nn.Module):
    """Pre-norm block: conditional position encoding, attention and FFN, each residual.

    ``x += DWConv3x3(x); x += DropPath(g1 * Attn(LN(x))); x += DropPath(g2 * FFN(LN(x)))``

    Args:
        embed_dims: C.
        num_heads: attention heads.
        attn_type: 'mala' or 'softmax'.
        mlp_ratio: FFN hidden width is ``int(mlp_ratio * C)``.
        drop_path: stochastic depth rate of this block.
        layer_scale_init: initial value of the per-channel scales g1, g2; None disables them.
        with_cp: recompute activations in backward (saves memory when training).
        impl: 'auto', 'triton' or 'torch' (:mod:`mala_mm.ops.dispatch`).
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str, mlp_ratio: float,
                 drop_path: float = 0., layer_scale_init: Optional[float] = 1.0, with_cp: bool = False,
                 impl: str = 'auto'):
        super().__init__()
        self.with_cp = with_cp
        self.impl = impl
        self.pos = ResidualDWConv(embed_dims, 3, impl=impl)
        self.norm1 = LayerNorm2d(embed_dims)
        self.attn = ATTENTION_KINDS[attn_type](embed_dims, num_heads, impl)
        self.norm2 = LayerNorm2d(embed_dims)
        self.ffn = ConvFFN(embed_dims, int(mlp_ratio * embed_dims), impl)
        self.drop_path_rate = drop_path
        # decided here: a graph that compared the rate would be compiled for each rate
        self.drops_paths = drop_path > 0
        if layer_scale_init is None:
            self.gamma_1 = self.gamma_2 = None
        else:
            self.gamma_1 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))

    @property
    def keep_prob(self) -> Optional[float]:
        """The probability that stochastic depth keeps each branch now, or None where it drops none (in eval, or
        at a rate of 0)."""
        return 1 - self.drop_path_rate if self.training and self.drops_paths else None

    def _add_branch(self, x: Tensor, branch: Tensor, gamma: Optional[Tensor], factors: Optional[Tensor],
                    norm: Optional[LayerNorm2d] = None, as_output: bool = False):
        norm_args = None if norm is None else (norm.norm.weight, norm.norm.bias, norm.norm.eps)
        return add_branch(x, branch, gamma, self.keep_prob, factors, norm_args, as_output, self.impl)

    def _forward(self, x: Tensor, rope: Optional[RotaryTables], drop_factors: Optional[Tensor],
                 out_norm: Optional[LayerNorm2d]):
        attn_factors, ffn_factors = (None, None) if drop_factors is None else drop_factors
        x = self.pos(x)
        x, normed = self._add_branch(x, self.attn(self.norm1(x), rope), self.gamma_1, attn_factors, self.norm2)
        return self._add_branch(x, self.ffn(normed), self.gamma_2, ffn_factors, out_norm, as_output=True)

    def forward(self, x: Tensor, rope: Optional[RotaryTables] = None, drop_factors: Optional[Tensor] = None,
                out_norm: Optional[LayerNorm2d] = None):
        """x: (B, C, H, W); rope: the stage's RoPE tables for (H, W), or None; drop_factors: (2, B, 1, 1, 1)
        stochastic depth factors of the two branches (:func:`~mala_mm.ops.residual.drop_path_factors`), or None
        to draw them here where they are needed; out_norm: the stage's output norm where this is its last block, or
        None. Returns the (B, C, H, W) output, and where out_norm is given also its contiguous normalised map."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, rope, drop_factors, out_norm, use_reentrant=False)
        return self._forward(x, rope, drop_factors, out_norm)


class MALAStage(nn.Module):
    """``depth`` blocks sharing one RoPE, then an optional downsample to the next stage's width.

    Args:
        embed_dims, num_heads, attn_type, mlp_ratio, layer_scale_init, with_cp, impl: as in
            :class:`MALABlock`.
        drop_paths: one stochastic depth rate per block (its length is the depth).
        out_dims: width after the downsample, or None for the last stage (no downsample).
        norm_cfg: norm of the downsample.
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str, mlp_ratio: float,
                 drop_paths: Sequence[float], layer_scale_init: Optional[float], out_dims: Optional[int],
                 norm_cfg: dict, with_cp: bool = False, impl: str = 'auto'):
        super().__init__()
        self.RoPE = RoPE2d(embed_dims // num_heads)  # attribute name as in the released checkpoints
        self.blocks = nn.ModuleList(
            MALABlock(embed_dims, num_heads, attn_type, mlp_ratio, rate, layer_scale_init, with_cp, impl)
            for rate in drop_paths)
        self.downsample = None if out_dims is None else ConvDownsample(embed_dims, out_dims, norm_cfg)

    def keep_probs(self) -> List[float]:
        """The probability of keeping each branch, two per block, in the order of :meth:`forward`'s factors."""
        return [1 - block.drop_path_rate for block in self.blocks for _ in range(2)]

    def forward(self, x: Tensor, drop_factors: Optional[Tensor] = None, out_norm: Optional[LayerNorm2d] = None,
                compiled_block: Optional[Callable] = None):
        """x: (B, C, H, W); drop_factors: the (2 depth, B, 1, 1, 1) stochastic depth factors of the blocks'
        branches (:meth:`keep_probs`), or None; out_norm: the norm of the stage's output, or None; compiled_block: a
        compiled :func:`~mala_mm.ops.runtime.call_block` that runs each block, or None to call them here. Returns
        the stage output (B, C, H, W), normalised by out_norm and contiguous where it is given, and the downsampled
        output (or None)."""
        rope = self.RoPE.tables(*x.shape[-2:], dtype=x.dtype)  # once per stage, also in a traced graph
        out = None
        for i, block in enumerate(self.blocks):
            factors = None if drop_factors is None else drop_factors[2 * i:2 * i + 2]
            if compiled_block is not None:
                x = compiled_block(block, x, rope, factors)
            elif i == len(self.blocks) - 1 and out_norm is not None:
                # the last block adds its FFN branch and normalises the sum in one operator
                x, out = block(x, rope, factors, out_norm)
            else:
                x = block(x, rope, factors)
        if out is None:
            out = x if out_norm is None else out_norm(x).contiguous()
        return out, (None if self.downsample is None else self.downsample(x))
