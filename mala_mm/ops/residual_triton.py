"""A block's residual branch added back, and optionally the LayerNorm that reads the sum (the FFN's, or a stage's
output norm), in Triton: one launch a forward, two a backward (:func:`~mala_mm.ops.residual.scaled_residual`,
:func:`~mala_mm.ops.residual.scaled_residual_norm`).

Unfused, the branch's scale (layer scale times stochastic depth), its addition and the LayerNorm after it are three
launches a forward; the backward adds the LayerNorm's gradient, the sum of the two gradients of the residual
stream, the branch's and the layer scale's: six. Here a program takes BLOCK_P pixels of a dense channels-last map
with all their channels (a LayerNorm's row), reads the stream and the branch in their dtypes and computes in fp32.
The backward's kernel writes the stream's and the branch's gradients and, each program, its sums of the layer
scale's and the norm's parameter gradients over its pixels into its own row of one fp32 workspace, which one
``sum(0)`` reduces: no atomics, the same gradients from run to run.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from .torch_compat import autocast_dtype, autocast_enabled
from .triton_launch import GPU, in_kernels_or_torch, launch, registers_a_thread

# the pixel count changes with every image: Triton would compile again each time it moved between 1, multiples of 16
# and other values
SIZE_ARGS = ['num_pixels', 'pixels_per_item']
# elements a program's tile holds: BLOCK_P pixels by the channels rounded up to a power of two
TILE_ELEMENTS = 2048
# at most this many rows of partial sums in the backward's workspace, one per program
MAX_PARTIAL_ROWS = 512


@triton.jit
def _tile(tile, num_pixels, channels, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """A tile's pixels, channels, where it lies inside the map, and its elements' offsets in a dense map."""
    pixels = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    chans = tl.arange(0, BLOCK_C)
    valid = (pixels[:, None] < num_pixels) & (chans[None, :] < channels)
    return pixels, chans, valid, pixels[:, None] * channels + chans[None, :]


@triton.jit
def _map_offsets(pixels, chans, pixels_per_item, stride_b, stride_p, stride_c):
    """Offsets of a tile's elements in a map addressed by batch item, pixel within it and channel."""
    return (pixels // pixels_per_item)[:, None] * stride_b + (pixels % pixels_per_item)[:, None] * stride_p + \
        chans[None, :] * stride_c


@triton.jit
def _pixel_factors(factors_ptr, pixels, num_pixels, pixels_per_item, HAS_FACTORS: tl.constexpr):
    """Each pixel's batch item's stochastic depth factor (1 without stochastic depth), fp32."""
    factor = tl.full(pixels.shape, 1.0, tl.float32)
    if HAS_FACTORS:
        factor = tl.load(factors_ptr + pixels // pixels_per_item, mask=pixels < num_pixels, other=0.0).to(tl.float32)
    return factor


@triton.jit
def _channel_vector(ptr, chans, channels):
    """A (C,) parameter's values for the tile's channels, fp32."""
    return tl.load(ptr + chans, mask=chans < channels, other=0.0).to(tl.float32)


@triton.jit
def _normalised(out, valid, channels, eps):
    """(out - mean) / std over each pixel's channels (0 outside the map), and 1 / std."""
    mean = tl.sum(out, 1) / channels
    centred = tl.where(valid, out - mean[:, None], 0.0)
    rstd = 1 / tl.sqrt(tl.sum(centred * centred, 1) / channels + eps)
    return centred * rstd[:, None], rstd


@triton.jit(do_not_specialize=SIZE_ARGS)
def _residual_kernel(x_ptr, branch_ptr, gamma_ptr, factors_ptr, weight_ptr, bias_ptr, out_ptr, normed_ptr,
                     stride_nb, stride_np, stride_nc, num_pixels, pixels_per_item, channels, eps,
                     HAS_FACTORS: tl.constexpr, NORM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = x + scale * branch; normed = LayerNorm(out) where NORM, at the strides stride_n* (batch item, pixel,
    channel)."""
    pixels, chans, valid, offsets = _tile(tl.program_id(0), num_pixels, channels, BLOCK_P, BLOCK_C)
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    branch = tl.load(branch_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    factor = _pixel_factors(factors_ptr, pixels, num_pixels, pixels_per_item, HAS_FACTORS)
    gamma = _channel_vector(gamma_ptr, chans, channels)
    out = x + (factor[:, None] * gamma[None, :]) * branch
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=valid)
    if NORM:
        xhat, _ = _normalised(out, valid, channels, eps)
        normed = xhat * _channel_vector(weight_ptr, chans, channels)[None, :] + \
            _channel_vector(bias_ptr, chans, channels)[None, :]
        normed_offsets = _map_offsets(pixels, chans, pixels_per_item, stride_nb, stride_np, stride_nc)
        tl.store(normed_ptr + normed_offsets, normed.to(normed_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['tiles_per_program'])
def _residual_grad_kernel(out_ptr, branch_ptr, gamma_ptr, factors_ptr, weight_ptr, grad_ptr, grad_normed_ptr,
                          grad_stream_ptr, grad_branch_ptr, partial_ptr, stride_gb, stride_gp, stride_gc,
                          num_pixels, pixels_per_item, channels, eps, tiles_per_program,
                          HAS_FACTORS: tl.constexpr, NORM: tl.constexpr, BLOCK_P: tl.constexpr,
                          BLOCK_C: tl.constexpr):
    """The gradients of the stream (where NORM: the stream's own plus the LayerNorm's; else it is ``grad`` itself
    and not written) and of the branch, for tiles_per_program tiles; the program's sums of the gradients of gamma,
    and where NORM of the norm's weight and bias, into its row of ``partial`` (3 x channels). The normalised map's
    gradient is read at the strides stride_g* (batch item, pixel, channel)."""
    program = tl.program_id(0)
    chans = tl.arange(0, BLOCK_C)
    gamma = _channel_vector(gamma_ptr, chans, channels)
    weight = _channel_vector(weight_ptr, chans, channels)
    grad_gamma = tl.zeros((BLOCK_C,), tl.float32)
    grad_weight = tl.zeros((BLOCK_C,), tl.float32)
    grad_bias = tl.zeros((BLOCK_C,), tl.float32)
    for i in range(tiles_per_program):
        pixels, chans, valid, offsets = _tile(program * tiles_per_program + i, num_pixels, channels, BLOCK_P, BLOCK_C)
        grad = tl.load(grad_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        if NORM:
            out = tl.load(out_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
            xhat, rstd = _normalised(out, valid, channels, eps)
            grad_normed_offsets = _map_offsets(pixels, chans, pixels_per_item, stride_gb, stride_gp, stride_gc)
            grad_normed = tl.load(grad_normed_ptr + grad_normed_offsets, mask=valid, other=0.0).to(tl.float32)
            grad_xhat = grad_normed * weight[None, :]
            # LayerNorm's input gradient: rstd (g - mean(g) - xhat mean(g xhat)), means over the channels
            grad += rstd[:, None] * (grad_xhat - tl.sum(grad_xhat, 1)[:, None] / channels
                                     - xhat * (tl.sum(grad_xhat * xhat, 1) / channels)[:, None])
            grad = tl.where(valid, grad, 0.0)
            tl.store(grad_stream_ptr + offsets, grad.to(grad_stream_ptr.dtype.element_ty), mask=valid)
            grad_weight += tl.sum(grad_normed * xhat, 0)
            grad_bias += tl.sum(grad_normed, 0)
        factor = _pixel_factors(factors_ptr, pixels, num_pixels, pixels_per_item, HAS_FACTORS)
        branch = tl.load(branch_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        tl.store(grad_branch_ptr + offsets,
                 (grad * (factor[:, None] * gamma[None, :])).to(grad_branch_ptr.dtype.element_ty), mask=valid)
        grad_gamma += tl.sum(grad * branch * factor[:, None], 0)
    row = partial_ptr + program * 3 * channels
    mask = chans < channels
    tl.store(row + chans, grad_gamma, mask=mask)
    tl.store(row + channels + chans, grad_weight, mask=mask)
    tl.store(row + 2 * channels + chans, grad_bias, mask=mask)


def _dense_channels_last(t: Tensor) -> Tensor:
    """t, or a copy of it, as a dense channels-last map: the kernels address (pixel, channel) as pixel * C + c."""
    return t.contiguous(memory_format=torch.channels_last)


def _pixel_strides(t: Tensor) -> Tuple[Tensor, Tuple[int, int, int]]:
    """t, or a channels-last copy of it, and its strides over batch items, pixels (row-major) and channels: a
    channels-last or a contiguous map is read as it is."""
    _, _, height, width = t.shape
    if height > 1 and width > 1 and t.stride(2) != width * t.stride(3):
        t = _dense_channels_last(t)
    return t, (t.stride(0), t.stride(3) if width > 1 else t.stride(2), t.stride(1))


class ResidualPlan:
    """How the kernels split a (B, C, H, W) map: BLOCK_P pixels with all their channels a tile, over 8 warps (8
    elements a thread): with 4 warps, or 16 elements a thread, the backward with the norm spills (Triton 3.6 and
    3.9, tools/compile_kernels.py)."""

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


def variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU), for each tile width that
    the stages of MALA-T to -L take (64 to 640 channels)."""
    for channels in (64, 96, 192, 320, 640):
        plan = ResidualPlan(torch.empty(1, channels, 8, 8))
        for factors in (False, True):
            for norm in (False, True):
                for kernel in (_residual_kernel, _residual_grad_kernel):
                    yield kernel, dict(plan.options, HAS_FACTORS=factors, NORM=norm)


class _ScaledResidual(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Optional[Tensor],
                bias: Optional[Tensor], eps: float, normed_dtype: Optional[torch.dtype],
                normed_format: torch.memory_format, torch_fallback: Optional[Callable]):
        x, branch = _dense_channels_last(x), _dense_channels_last(branch)
        plan = ResidualPlan(x)
        norm = weight is not None
        # the dtype torch's addcmul would give: the fp32 layer scale lifts a low-precision stream (the stem's output
        # under autocast) to fp32, as in torch operators
        out = torch.empty_like(x, dtype=torch.promote_types(torch.promote_types(x.dtype, branch.dtype), gamma.dtype))
        normed = torch.empty_like(x, dtype=normed_dtype or out.dtype, memory_format=normed_format) if norm else out
        launch(_residual_kernel, (plan.tiles,),
               x, branch, gamma, x if factors is None else factors, gamma if weight is None else weight,
               gamma if bias is None else bias, out, normed, *_pixel_strides(normed)[1], *plan.sizes(eps),
               HAS_FACTORS=factors is not None, NORM=norm, **plan.options)
        ctx.save_for_backward(out, branch, gamma, factors, weight)
        ctx.eps, ctx.stream_dtype, ctx.torch_fallback = eps, x.dtype, torch_fallback
        return (out, normed) if norm else out

    @staticmethod
    def backward(ctx, grad: Tensor, grad_normed: Optional[Tensor] = None):
        inputs = (*ctx.saved_tensors, grad, grad_normed, ctx.eps, ctx.stream_dtype)
        grads = in_kernels_or_torch(lambda: _gradients(*inputs), ctx.torch_fallback,
                                    lambda: _gradients_in_torch(*inputs))
        return (*grads[:3], None, *grads[3:], None, None, None, None)


def _gradients(out: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Optional[Tensor],
               grad: Tensor, grad_normed: Optional[Tensor], eps: float, stream_dtype: torch.dtype) -> tuple:
    """The gradients of the stream, the branch, gamma and, with the norm, its weight and bias."""
    norm = weight is not None
    grad = _dense_channels_last(grad)
    grad_normed, grad_normed_strides = _pixel_strides(grad_normed if norm else grad)
    plan = ResidualPlan(out)
    grad_stream = torch.empty_like(out, dtype=stream_dtype) if norm else grad.to(stream_dtype)
    grad_branch = torch.empty_like(branch)
    partial = out.new_empty((plan.programs, 3 * plan.channels), dtype=torch.float32)
    launch(_residual_grad_kernel, (plan.programs,),
           out, branch, gamma, out if factors is None else factors, gamma if weight is None else weight, grad,
           grad_normed, grad_stream, grad_branch, partial, *grad_normed_strides, *plan.sizes(eps),
           plan.tiles_per_program, HAS_FACTORS=factors is not None, NORM=norm, **plan.options)
    sums = partial.sum(0)
    channels = plan.channels
    grads_norm = (sums[channels:2 * channels], sums[2 * channels:]) if norm else (None, None)
    return grad_stream, grad_branch, sums[:channels].view(gamma.shape), *grads_norm


def _gradients_in_torch(out: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor],
                        weight: Optional[Tensor], grad: Tensor, grad_normed: Optional[Tensor], eps: float,
                        stream_dtype: torch.dtype) -> tuple:
    """:func:`_gradients` in torch operators, where the backward's kernel fails on a GPU."""
    grad = grad.float()
    grads_norm = (None, None)
    if weight is not None:
        with torch.enable_grad():
            leaves = (out.detach().float().requires_grad_(), weight.detach().requires_grad_(),
                      torch.zeros_like(weight, requires_grad=True))  # the bias's value changes no gradient
            normed = F.layer_norm(leaves[0].permute(0, 2, 3, 1), weight.shape, leaves[1], leaves[2], eps)
            grad_out, *grads_norm = torch.autograd.grad(normed.permute(0, 3, 1, 2), leaves, grad_normed.float())
        grad = grad + grad_out
    factor = 1 if factors is None else factors.view(-1, 1, 1, 1)
    grad_branch = (grad * (gamma.view(1, -1, 1, 1) * factor)).to(branch.dtype)
    grad_gamma = (grad * branch.float() * factor).sum((0, 2, 3))
    return grad.to(stream_dtype), grad_branch, grad_gamma, *grads_norm


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None,
                    torch_fallback: Optional[Callable] = None) -> Tensor:
    """``x + factors * gamma * branch`` in one launch (two in the backward); the arguments and result of
    :func:`~mala_mm.ops.residual.scaled_residual`, in the promoted dtype of x, branch and gamma. torch_fallback:
    where the backward's kernel fails on the GPU, the :class:`~.dispatch.Operator` that takes the operator to
    torch operators from then on, the backward's gradients in torch operators; None: the error stops the
    backward."""
    return _ScaledResidual.apply(x, branch, gamma.reshape(-1), _flat(factors), None, None, 0.0, None,
                                 torch.channels_last, torch_fallback)


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, as_output: bool = False,
                         torch_fallback: Optional[Callable] = None) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_residual` and the LayerNorm of its result over the channels, in one launch (two in the
    backward): the arguments and results of :func:`~mala_mm.ops.residual.scaled_residual_norm`. The normalised map
    is channels-last in autocast's dtype where autocast is on (the next conv's input), else in the stream's; where
    ``as_output``, contiguous in the stream's."""
    device = x.device.type
    normed_dtype = autocast_dtype(device) if autocast_enabled(device) and not as_output else None
    normed_format = torch.contiguous_format if as_output else torch.channels_last
    return _ScaledResidual.apply(x, branch, gamma.reshape(-1), _flat(factors), weight, bias, eps, normed_dtype,
                                 normed_format, torch_fallback)


def _flat(factors: Optional[Tensor]) -> Optional[Tensor]:
    """The (B,) factors, dense: an expanded (stride 0) tensor would be read past its storage."""
    return None if factors is None else factors.reshape(-1).contiguous()
