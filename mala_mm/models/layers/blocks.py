"""Building blocks of the MALA backbone: norms, stem, downsample, FFN, transformer block and stage.

Module and parameter names follow the released checkpoints so that their state dicts load unchanged.
"""
from typing import Callable, List, Optional, Sequence

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from torch import Tensor, nn

from ...ops.conv2d import channels_last_strides
from ...ops.depthwise import residual_depthwise_conv
from ...ops.residual import drop_path_factors, scaled_residual, scaled_residual_norm
from ...ops.rope import RotaryTables
from ...ops.torch_compat import compiling_to_run, is_compiling
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
        return residual_depthwise_conv(x, self.weight, self.bias, self.centre_tap, self.gelu, self.impl)

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
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if layer_scale_init is None:
            self.gamma_1 = self.gamma_2 = None
        else:
            self.gamma_1 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((1, embed_dims, 1, 1), float(layer_scale_init)))

    @property
    def drops_paths(self) -> bool:
        """Whether stochastic depth drops this block's branches now (training, a rate above 0)."""
        return self.training and isinstance(self.drop_path, DropPath)

    def _add_branch(self, x: Tensor, branch: Tensor, gamma: Optional[Tensor], factors: Optional[Tensor],
                    norm: Optional[LayerNorm2d] = None, as_output: bool = False):
        """``x + DropPath(gamma * branch)``, and where ``norm`` is given also ``norm`` of it (contiguous where
        ``as_output``): in eager mode :mod:`mala_mm.ops.residual`'s operators with the branch's stochastic depth
        ``factors`` (drawn here where the stage drew none); traced and compiled graphs record plain operators, which
        their compilers fuse and export."""
        if gamma is None or torch.jit.is_tracing() or is_compiling():
            if gamma is None:
                x = x + self.drop_path(branch)
            else:
                x = x + self.drop_path(gamma * branch) if self.drops_paths else torch.addcmul(x, gamma, branch)
            if norm is None:
                return x
            return x, (norm(x).contiguous() if as_output else norm(x))
        if self.drops_paths and factors is None:
            factors = drop_path_factors(gamma.new_full((1,), 1 - self.drop_path.drop_prob), x.shape[0])[0]
        factors = factors if self.drops_paths else None
        if norm is None:
            return scaled_residual(x, branch, gamma, factors, self.impl)
        layer_norm = norm.norm
        return scaled_residual_norm(x, branch, gamma, factors, layer_norm.weight, layer_norm.bias, layer_norm.eps,
                                    self.impl, as_output)

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


def call_block(block: MALABlock, x: Tensor, rope: Optional[RotaryTables],
               drop_factors: Optional[Tensor] = None) -> Tensor:
    """``block(x, rope, drop_factors)``: the function :class:`MALAStage` runs each block through, which
    ``torch.compile`` may compile (``MALA(compile=...)``): one compiled function for every block of every stage."""
    return block(x, rope, drop_factors)


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
        return [1 - getattr(block.drop_path, 'drop_prob', 0.) for block in self.blocks for _ in range(2)]

    def forward(self, x: Tensor, run_block: Callable = call_block, drop_factors: Optional[Tensor] = None,
                out_norm: Optional[LayerNorm2d] = None):
        """x: (B, C, H, W); run_block: :func:`call_block` or a compiled version of it; drop_factors: the
        (2 depth, B, 1, 1, 1) stochastic depth factors of the blocks' branches (:meth:`keep_probs`), or None;
        out_norm: the norm of the stage's output, or None. Returns the stage output (B, C, H, W), normalised by
        out_norm and contiguous where it is given, and the downsampled output (or None)."""
        rope = self.RoPE.tables(*x.shape[-2:], dtype=x.dtype)  # once per stage, also in a traced graph
        out = None
        for i, block in enumerate(self.blocks):
            factors = drop_factors[2 * i:2 * i + 2] if drop_factors is not None and block.drops_paths else None
            if i == len(self.blocks) - 1 and out_norm is not None and run_block is call_block:
                # eagerly, the last block adds its FFN branch and normalises the sum in one operator
                x, out = block(x, rope, factors, out_norm)
            else:
                x = run_block(block, x, rope, factors)
        if out is None:
            out = x if out_norm is None else out_norm(x).contiguous()
        return out, (None if self.downsample is None else self.downsample(x))
