"""Building blocks of the MALA backbone: norms, stem, downsample, FFN, transformer block and stage.

Module and parameter names follow the released checkpoints so that their state dicts load unchanged.
"""
from typing import Callable, Optional, Sequence

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from torch import Tensor, nn

from ...ops.residual import drop_path_factors, scaled_residual
from ...ops.torch_compat import autocast_enabled, compiling_to_run, is_compiling
from .attention import MALAttention, SoftmaxAttention
from .conv import Conv2d, channels_last_strides
from .rope import RoPE2d, RotaryTables

ATTENTION_KINDS = {'mala': MALAttention, 'softmax': SoftmaxAttention}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map (eps 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        if compiling_to_run():
            # the same normalisation written over dim 1, for the compiler to fuse: the permuted view below, saved
            # for backward, is a graph output whose symbolic strides inductor cannot order under dynamic sizes
            mean = x.mean(1, keepdim=True)
            centred = x - mean
            variance = centred.square().mean(1, keepdim=True)
            scale = self.norm.weight[:, None, None] * torch.rsqrt(variance + self.norm.eps)
            return torch.addcmul(self.norm.bias[:, None, None], centred, scale)
        # on a channels-last map the permutes are free and layer_norm runs as one fused kernel
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvStem(nn.Module):
    """Stride-4 stem: four 3x3 convs (strides 2, 1, 1, 2), each followed by a norm, GELU between them.

    (B, in_channels, H, W) -> (B, C, ceil(H / 4), ceil(W / 4)).
    """

    def __init__(self, in_channels: int, embed_dims: int, norm_cfg: dict):
        super().__init__()
        mid = embed_dims // 2
        layers = []
        for i, (c_in, c_out, stride) in enumerate(
                [(in_channels, mid, 2), (mid, mid, 1), (mid, mid, 1), (mid, embed_dims, 2)]):
            layers += [Conv2d(c_in, c_out, 3, stride, 1), build_norm_layer(norm_cfg, c_out)[1]]
            if i < 3:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv and a norm between stages: (B, C_in, H, W) -> (B, C_out, ceil(H/2), ceil(W/2))."""

    def __init__(self, in_channels: int, out_channels: int, norm_cfg: dict):
        super().__init__()
        self.reduction = Conv2d(in_channels, out_channels, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1]

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.reduction(x))


class ResidualDWConv(Conv2d):
    """``x + DWConv(x)``, a depth-wise conv (size-preserving, odd kernel) with its input added back.

    Computed as one conv whose kernel has 1 added at its centre (the buffer ``centre_tap``, made once): one pass
    over the map instead of a conv and an add. The parameters are those of the plain conv, so the state dict is
    unchanged. Under autocast the conv runs in low precision, and the fused form would round the residual stream
    ``x`` to it once per block; there the conv and the add stay apart, as released, and the sum keeps x's precision.
    """

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)
        centre_tap = channels_last_strides(torch.zeros_like(self.weight))
        centre_tap[..., kernel_size // 2, kernel_size // 2] = 1
        self.register_buffer('centre_tap', centre_tap, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if autocast_enabled(x.device.type):
            return x + super().forward(x)
        return self._conv_forward(x, self.weight + self.centre_tap, self.bias)


class ConvFFN(nn.Module):
    """conv1x1 (C -> hidden), GELU, residual depth-wise 3x3 conv, conv1x1 (hidden -> C)."""

    def __init__(self, embed_dims: int, hidden_dims: int):
        super().__init__()
        self.fc1 = Conv2d(embed_dims, hidden_dims, 1)
        self.act = nn.GELU()
        self.dwconv = ResidualDWConv(hidden_dims, 3)
        self.fc2 = Conv2d(hidden_dims, embed_dims, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dwconv(self.act(self.fc1(x))))


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
        attn_impl: 'auto', 'triton' or 'torch' (:data:`~.attention.ATTENTION_IMPLS`).
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str, mlp_ratio: float,
                 drop_path: float = 0., layer_scale_init: Optional[float] = 1.0, with_cp: bool = False,
                 attn_impl: str = 'auto'):
        super().__init__()
        self.with_cp = with_cp
        self.pos = ResidualDWConv(embed_dims, 3)
        self.norm1 = LayerNorm2d(embed_dims)
        self.attn = ATTENTION_KINDS[attn_type](embed_dims, num_heads, attn_impl)
        self.norm2 = LayerNorm2d(embed_dims)
        self.ffn = ConvFFN(embed_dims, int(mlp_ratio * embed_dims))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if layer_scale_init is None:
            self.gamma_1 = self.gamma_2 = None
        else:
            self.gamma_1 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))

    def _add_branch(self, x: Tensor, branch: Tensor, gamma: Optional[Tensor]) -> Tensor:
        """``x + DropPath(gamma * branch)``: in eager mode :func:`~mala_mm.ops.residual.scaled_residual`; traced
        and compiled graphs record plain operators, which their compilers fuse and export."""
        if gamma is None:
            return x + self.drop_path(branch)
        dropping = self.training and isinstance(self.drop_path, DropPath)
        if torch.jit.is_tracing() or is_compiling():
            return x + self.drop_path(gamma * branch) if dropping else torch.addcmul(x, gamma, branch)
        factors = drop_path_factors(x.shape[0], self.drop_path.drop_prob, gamma) if dropping else None
        return scaled_residual(x, branch, gamma, factors)

    def _forward(self, x: Tensor, rope: Optional[RotaryTables]) -> Tensor:
        x = self.pos(x)
        x = self._add_branch(x, self.attn(self.norm1(x), rope), self.gamma_1)
        return self._add_branch(x, self.ffn(self.norm2(x)), self.gamma_2)

    def forward(self, x: Tensor, rope: Optional[RotaryTables] = None) -> Tensor:
        """x: (B, C, H, W); rope: the stage's RoPE tables for (H, W), or None. Returns (B, C, H, W)."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)


def call_block(block: MALABlock, x: Tensor, rope: Optional[RotaryTables]) -> Tensor:
    """``block(x, rope)``: the function :class:`MALAStage` runs each block through, which ``torch.compile`` may
    compile (``MALA(compile=...)``): one compiled function for every block of every stage."""
    return block(x, rope)


class MALAStage(nn.Module):
    """``depth`` blocks sharing one RoPE, then an optional downsample to the next stage's width.

    Args:
        embed_dims, num_heads, attn_type, mlp_ratio, layer_scale_init, with_cp, attn_impl: as in
            :class:`MALABlock`.
        drop_paths: one stochastic depth rate per block (its length is the depth).
        out_dims: width after the downsample, or None for the last stage (no downsample).
        norm_cfg: norm of the downsample.
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str, mlp_ratio: float,
                 drop_paths: Sequence[float], layer_scale_init: Optional[float], out_dims: Optional[int],
                 norm_cfg: dict, with_cp: bool = False, attn_impl: str = 'auto'):
        super().__init__()
        self.RoPE = RoPE2d(embed_dims // num_heads)  # attribute name as in the released checkpoints
        self.blocks = nn.ModuleList(
            MALABlock(embed_dims, num_heads, attn_type, mlp_ratio, rate, layer_scale_init, with_cp, attn_impl)
            for rate in drop_paths)
        self.downsample = None if out_dims is None else ConvDownsample(embed_dims, out_dims, norm_cfg)

    def forward(self, x: Tensor, run_block: Callable = call_block):
        """x: (B, C, H, W); run_block: :func:`call_block` or a compiled version of it. Returns the stage output
        (B, C, H, W) and its downsampled map (or None)."""
        rope = self.RoPE.tables(*x.shape[-2:], dtype=x.dtype)  # once per stage, also in a traced graph
        for block in self.blocks:
            x = run_block(block, x, rope)
        return x, (None if self.downsample is None else self.downsample(x))
