"""The fused residual branch's launcher and autograd function: how a call splits its map into tiles, and the one
launch of its forward and of its backward (:mod:`.kernels`)."""
from typing import Callable, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from ..torch_compat import autocast_dtype, autocast_enabled
from ..triton_helpers import MAX_PARTIAL_ROWS, dense_channels_last
from ..triton_launch import GPU, in_kernels_or_torch, launch, registers_a_thread
from .kernels import residual_grad_kernel, residual_kernel

# elements a program's tile holds: BLOCK_P pixels by the channels rounded up to a power of two
TILE_ELEMENTS = 2048


def _pixel_strides(t: Tensor) -> Tuple[Tensor, Tuple[int, int, int]]:
    """t, or a channels-last copy of it, and its strides over batch items, pixels (row-major) and channels: a
    channels-last or a contiguous map is read as it is."""
    _, _, height, width = t.shape
    if height > 1 and width > 1 and t.stride(2) != width * t.stride(3):
        t = dense_channels_last(t)
    return t, (t.stride(0), t.stride(3) if width > 1 else t.stride(2), t.stride(1))


class ResidualPlan:
    """How the kernels split a (B, C, H, W) map: BLOCK_P pixels with all their channels a tile, over 8 warps (8
    elements a thread), which compile without spilling on every GPU Triton serves (tools/compile_kernels.py)."""

    def __init__(self, x: Tensor):
        batch, self.channels, height, width = x.shape
        self.pixels_per_item = height * width
        self.num_pixels = batch * self.pixels_per_item
        self.block_c = max(16, triton.next_power_of_2(self.channels))
        self.block_p = max(1, TILE_ELEMENTS // self.block_c)
        self.tiles = triton.cdiv(self.num_pixels, self.block_p)
        self.tiles_per_program = max(1, triton.cdiv(self.tiles, MAX_PARTIAL_ROWS))  # an empty batch has no tiles
        self.programs = triton.cdiv(self.tiles, self.tiles_per_program)
        self.options = dict(BLOCK_P=self.block_p, BLOCK_C=self.block_c, num_warps=8,
                            maxnreg=registers_a_thread(8))

    def sizes(self, eps: float) -> tuple:
        return self.num_pixels, self.pixels_per_item, self.channels, eps


def _variants(norm: bool) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant a launcher makes (the same on every GPU), for each tile width that
    the stages of MALA-T to -L take (64 to 640 channels)."""
    for channels in (64, 96, 192, 320, 640):
        plan = ResidualPlan(torch.empty(1, channels, 8, 8))
        for factors in (False, True):
            yield residual_kernel, dict(plan.options, HAS_FACTORS=factors, NORM=norm)
            for sum_kept in (False, True) if norm else (False,):
                yield residual_grad_kernel, dict(plan.options, HAS_FACTORS=factors, NORM=norm, SUM_KEPT=sum_kept)


def scaled_residual_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    return _variants(norm=False)


def scaled_residual_norm_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    return _variants(norm=True)


class _ScaledResidual(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Optional[Tensor],
                bias: Optional[Tensor], eps: float, normed_dtype: Optional[torch.dtype], as_output: bool,
                torch_fallback: Optional[Callable]):
        x, branch = dense_channels_last(x), dense_channels_last(branch)
        plan = ResidualPlan(x)
        norm = weight is not None
        # the dtype torch's addcmul would give: the fp32 layer scale lifts a low-precision stream (the stem's output
        # under autocast) to fp32, as in torch operators
        out = torch.empty_like(x, dtype=torch.promote_types(torch.promote_types(x.dtype, branch.dtype), gamma.dtype))
        normed_format = torch.contiguous_format if as_output else torch.channels_last
        normed = torch.empty_like(x, dtype=normed_dtype or out.dtype, memory_format=normed_format) if norm else out
        launch(residual_kernel, (plan.tiles,),
               x, branch, gamma, x if factors is None else factors, gamma if weight is None else weight,
               gamma if bias is None else bias, out, normed, *_pixel_strides(normed)[1], *plan.sizes(eps),
               HAS_FACTORS=factors is not None, NORM=norm, **plan.options)
        # the norm's backward takes the sum again from x, which the block's first norm keeps for its own backward:
        # keeping the sum would hold one more map of the stream. A stage's output is the other way round: the
        # downsample's conv keeps the sum (in fp32) and nothing keeps x
        sum_kept = norm and as_output
        ctx.save_for_backward((out if sum_kept else x) if norm else None, branch, gamma, factors, weight)
        ctx.eps, ctx.stream_dtype, ctx.sum_kept, ctx.torch_fallback = eps, x.dtype, sum_kept, torch_fallback
        return (out, normed) if norm else out

    @staticmethod
    def backward(ctx, grad: Tensor, grad_normed: Optional[Tensor] = None):
        inputs = (*ctx.saved_tensors, grad, grad_normed, ctx.eps, ctx.stream_dtype, ctx.sum_kept)
        grads = in_kernels_or_torch(lambda: _gradients(*inputs), ctx.torch_fallback,
                                    lambda: _gradients_in_torch(*inputs))
        return (*grads[:3], None, *grads[3:], None, None, None, None)


def _gradients(x: Optional[Tensor], branch: Tensor, gamma: Tensor, factors: Optional[Tensor],
               weight: Optional[Tensor], grad: Tensor, grad_normed: Optional[Tensor], eps: float,
               stream_dtype: torch.dtype, sum_kept: bool) -> tuple:
    """The gradients of the stream, the branch, gamma and, with the norm (and x, the stream before the branch, or
    where ``sum_kept`` the sum), its weight and bias."""
    norm = weight is not None
    grad = dense_channels_last(grad)
    grad_normed, grad_normed_strides = _pixel_strides(grad_normed if norm else grad)
    plan = ResidualPlan(branch)
    grad_stream = torch.empty_like(branch, dtype=stream_dtype) if norm else grad.to(stream_dtype)
    grad_branch = torch.empty_like(branch)
    partial = branch.new_empty((plan.programs, 3 * plan.channels), dtype=torch.float32)
    launch(residual_grad_kernel, (plan.programs,),
           branch if x is None else x, branch, gamma, branch if factors is None else factors,
           gamma if weight is None else weight, grad,
           grad_normed, grad_stream, grad_branch, partial, *grad_normed_strides, *plan.sizes(eps),
           plan.tiles_per_program, HAS_FACTORS=factors is not None, NORM=norm, SUM_KEPT=sum_kept, **plan.options)
    sums = partial.sum(0)
    channels = plan.channels
    grads_norm = (sums[channels:2 * channels], sums[2 * channels:]) if norm else (None, None)
    return grad_stream, grad_branch, sums[:channels].view(gamma.shape), *grads_norm


def _gradients_in_torch(x: Optional[Tensor], branch: Tensor, gamma: Tensor, factors: Optional[Tensor],
                        weight: Optional[Tensor], grad: Tensor, grad_normed: Optional[Tensor], eps: float,
                        stream_dtype: torch.dtype, sum_kept: bool) -> tuple:
    """:func:`_gradients` in torch operators, where the backward's kernel fails on a GPU."""
    grad = grad.float()
    grads_norm = (None, None)
    factor = 1 if factors is None else factors.view(-1, 1, 1, 1)
    if weight is not None:
        out = x.float() if sum_kept else x.float() + (gamma.view(1, -1, 1, 1) * factor) * branch.float()
        with torch.enable_grad():
            leaves = (out.requires_grad_(), weight.detach().requires_grad_(),
                      torch.zeros_like(weight, requires_grad=True))  # the bias's value changes no gradient
            normed = F.layer_norm(leaves[0].permute(0, 2, 3, 1), weight.shape, leaves[1], leaves[2], eps)
            grad_out, *grads_norm = torch.autograd.grad(normed.permute(0, 3, 1, 2), leaves, grad_normed.float())
        grad = grad + grad_out
    grad_branch = (grad * (gamma.view(1, -1, 1, 1) * factor)).to(branch.dtype)
    grad_gamma = (grad * branch.float() * factor).sum((0, 2, 3))
    return grad.to(stream_dtype), grad_branch, grad_gamma, *grads_norm


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None,
                    torch_fallback: Optional[Callable] = None) -> Tensor:
    """``x + factors * gamma * branch`` in one launch (two in the backward); the arguments and result of
    :func:`~mala_mm.ops.residual.scaled_residual`, in the promoted dtype of x, branch and gamma. torch_fallback:
    where the backward's kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator` that takes the operator to
    torch operators from then on, the backward's gradients in torch operators; None: the error stops the
    backward."""
    return _ScaledResidual.apply(x, branch, gamma.reshape(-1), _flat(factors), None, None, 0.0, None, False,
                                 torch_fallback)


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, as_output: bool = False,
                         torch_fallback: Optional[Callable] = None) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_residual` and the LayerNorm of its result over the channels, in one launch (two in the
    backward): the arguments and results of :func:`~mala_mm.ops.residual.scaled_residual_norm`. The normalised map
    is channels-last in autocast's dtype where autocast is on (the next conv's input), else in the stream's; where
    ``as_output``, contiguous in the stream's."""
    device = x.device.type
    normed_dtype = autocast_dtype(device) if autocast_enabled(device) and not as_output else None
    return _ScaledResidual.apply(x, branch, gamma.reshape(-1), _flat(factors), weight, bias, eps, normed_dtype,
                                 as_output, torch_fallback)


def _flat(factors: Optional[Tensor]) -> Optional[Tensor]:
    """The (B,) factors, dense: an expanded (stride 0) tensor would be read past its storage."""
    return None if factors is None else factors.reshape(-1).contiguous()
