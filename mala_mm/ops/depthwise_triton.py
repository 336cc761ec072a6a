"""MALA's depth-wise convolutions fused with the elementwise operators around them, in Triton: one launch a forward,
two a backward.

- :func:`residual_depthwise_conv`, ``a + DWConv(a)`` with ``a = x`` or ``GELU(x)``: a block's position encoding
  (3x3, on the fp32 residual stream) and its FFN's GELU and residual 3x3 conv (on fc1's output).
- :func:`gated_depthwise_conv`, ``(y + DWConv(v)) * o``: the attention's exit, the attention's output plus LePE
  (5x5) of the values, gated; v and o are channel slices of the qkvo projection's map, read in place.

Unfused, each is a conv, an add and a GELU or a product, as many launches again in the backward, and the maps
written and read again between them.

A program takes a tile of BLOCK_P pixels (flattened over batch items, rows and columns) by BLOCK_C channels, which
lie side by side in memory in channels-last maps, and runs over the k x k taps, reading each tap's neighbour tile
with the image's border masked: zero padding, and no tap reaches into the next batch item. The taps are a loop at
run time: unrolled, the compiler hoists every tap's loads, and ptxas (sm_90) gave the gated conv's backward 255
registers and spills even at 4 elements a thread. The maps are read in their dtypes (fp32, bf16 or fp16), the
weight and bias as they are (fp32 parameters, under autocast too), and all arithmetic is fp32.

The backward's kernel writes the inputs' gradients and, each program, its sums of the weight's and the bias's
gradients over the pixels it took into its own row of one fp32 workspace; one ``sum(0)`` over the rows gives both,
as views of its result. No atomics: the gradients are the same from run to run.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .triton_launch import (GPU, INTERPRETER_GPU, gpu_of, in_kernels_or_torch, launch, registers_a_thread,
                            torch_gradients)

# sizes that change with every image: Triton would compile a kernel again each time one moved between 1, multiples
# of 16 and other values, with nothing to gain for a size. The strides keep their specialisation: multiples of the
# channels, they keep their divisibility from image to image, and it tells the compiler how the loads align
SIZE_ARGS = ['height', 'width', 'num_pixels']

# at most this many rows of partial sums in the backward's workspace, one per chunk of pixel tiles: with 64
# channels and a 5x5 kernel, 512 rows are 3.4 MB for the sum to read; 512 chunks times the channel tiles are still
# several programs per SM of an H100 (132 SMs)
MAX_PARTIAL_ROWS = 512

# constants of GELU, 1 / sqrt(2) and 1 / sqrt(2 pi), which a compiled kernel reads only as constexpr globals
_INV_SQRT2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _gelu(x):
    """torch's exact GELU, x Phi(x)."""
    return 0.5 * x * (1 + tl.math.erf(x * _INV_SQRT2))


@triton.jit
def _gelu_slope(x):
    """The derivative of GELU: Phi(x) + x phi(x)."""
    return 0.5 * (1 + tl.math.erf(x * _INV_SQRT2)) + x * tl.exp(-0.5 * x * x) * _INV_SQRT_2PI


@triton.jit
def _activation(x, GELU: tl.constexpr):
    if GELU:
        x = _gelu(x)
    return x


@triton.jit
def _channel_tile(channels, BLOCK_C: tl.constexpr):
    """This program's channels, and which of them the maps have."""
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    return chans, chans < channels


@triton.jit
def _pixel_tile(tile, height, width, num_pixels, BLOCK_P: tl.constexpr):
    """The batch item, row and column of each flattened pixel ``(b H + h) W + w`` of a tile, and which pixels the
    maps have."""
    pixels = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    area = height * width
    return pixels // area, pixels % area // width, pixels % width, pixels < num_pixels


@triton.jit
def _pointers(ptr, batch, row, col, chans, stride_b, stride_h, stride_w):
    """The (BLOCK_P, BLOCK_C) pointers of a tile of a (B, C, H, W) map whose channel stride is 1."""
    return ptr + (batch * stride_b + row * stride_h + col * stride_w)[:, None] + chans[None, :]


@triton.jit
def _load(ptrs, valid):
    """A tile as fp32, zero where not valid."""
    return tl.load(ptrs, mask=valid, other=0.0).to(tl.float32)


@triton.jit
def _store(ptr, batch, row, col, chans, stride_b, stride_h, stride_w, value, valid):
    """A tile of a (B, C, H, W) map, in the map's dtype."""
    tl.store(_pointers(ptr, batch, row, col, chans, stride_b, stride_h, stride_w), value.to(ptr.dtype.element_ty),
             mask=valid)


@triton.jit
def _tap_offset(tap, KERNEL: tl.constexpr):
    """The rows and columns from a pixel to the neighbour that tap ``tap`` (row-major over k x k) weighs."""
    return tap // KERNEL - KERNEL // 2, tap % KERNEL - KERNEL // 2


@triton.jit
def _moved_inside(row, col, height, width, dy, dx):
    """(BLOCK_P, 1): whether each pixel of the tile moved dy rows and dx columns stays in its image (the bounds
    moved rather than the indices: four comparisons with scalars, no arithmetic on the tile)."""
    return ((row >= -dy) & (row < height - dy) & (col >= -dx) & (col < width - dx))[:, None]


@triton.jit
def _load_moved(ptrs, mask, stride_h, stride_w, dy, dx):
    """The map at each pixel of the tile moved dy rows and dx columns, as fp32; zero where mask is false (outside
    the image: the conv's zero padding)."""
    return tl.load(ptrs + dy * stride_h + dx * stride_w, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _tap_weights(weight_ptr, chans, in_chans, tap, KERNEL: tl.constexpr):
    """The (1, BLOCK_C) weights of one tap of a contiguous (C, 1, k, k) weight."""
    return tl.load(weight_ptr + chans * (KERNEL * KERNEL) + tap, mask=in_chans, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _plus_depthwise_conv(acc, ptrs, valid, row, col, height, width, stride_h, stride_w, weight_ptr, chans, in_chans,
                         GELU: tl.constexpr, KERNEL: tl.constexpr):
    """acc + the depth-wise conv of act(map), without bias: the sum over taps of weight * act(neighbour)."""
    for tap in range(KERNEL * KERNEL):
        dy, dx = _tap_offset(tap, KERNEL)
        inside = valid & _moved_inside(row, col, height, width, dy, dx)
        neighbour = _load_moved(ptrs, inside, stride_h, stride_w, dy, dx)
        acc += _tap_weights(weight_ptr, chans, in_chans, tap, KERNEL) * _activation(neighbour, GELU)
    return acc


@triton.jit
def _store_partial_sums(partial_ptr, grad_weight, grad_bias, chans, in_chans, channels,
                        KERNEL: tl.constexpr, BLOCK_T: tl.constexpr):
    """A program's sums of the weight's gradient, (BLOCK_T taps, BLOCK_C) laid out as (C, k^2), and of the bias's,
    (C,) after them, in its row of the workspace."""
    taps = tl.arange(0, BLOCK_T)[:, None]
    tl.store(partial_ptr + chans[None, :] * (KERNEL * KERNEL) + taps, grad_weight,
             mask=(taps < KERNEL * KERNEL) & in_chans[None, :])
    tl.store(partial_ptr + channels * KERNEL * KERNEL + chans, grad_bias, mask=in_chans)


@triton.jit(do_not_specialize=SIZE_ARGS)
def _residual_conv_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr,
                          stride_xb, stride_xh, stride_xw, stride_ob, stride_oh, stride_ow,
                          channels, height, width, num_pixels,
                          GELU: tl.constexpr, KERNEL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = a + conv(a) + bias, a = GELU(x) or x, for one tile."""
    chans, in_chans = _channel_tile(channels, BLOCK_C)
    batch, row, col, in_map = _pixel_tile(tl.program_id(0), height, width, num_pixels, BLOCK_P)
    valid = in_map[:, None] & in_chans[None, :]
    x = _pointers(x_ptr, batch, row, col, chans, stride_xb, stride_xh, stride_xw)
    out = _activation(_load(x, valid), GELU) + tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    out = _plus_depthwise_conv(out, x, valid, row, col, height, width, stride_xh, stride_xw, weight_ptr, chans,
                               in_chans, GELU, KERNEL)
    _store(out_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow, out, valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['tiles_per_program'])
def _residual_conv_grad_kernel(x_ptr, grad_ptr, weight_ptr, grad_x_ptr, partial_ptr,
                               stride_xb, stride_xh, stride_xw, stride_gb, stride_gh, stride_gw,
                               stride_dxb, stride_dxh, stride_dxw,
                               channels, height, width, num_pixels, tiles_per_program,
                               GELU: tl.constexpr, KERNEL: tl.constexpr, BLOCK_P: tl.constexpr,
                               BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """grad_x of a chunk of tiles_per_program tiles, and the chunk's sums of the weight's and bias's gradients."""
    chunk = tl.program_id(0)
    chans, in_chans = _channel_tile(channels, BLOCK_C)
    taps = tl.arange(0, BLOCK_T)[:, None]
    grad_weight = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    grad_bias = tl.zeros((BLOCK_C,), tl.float32)
    for step in range(tiles_per_program):
        batch, row, col, in_map = _pixel_tile(chunk * tiles_per_program + step, height, width, num_pixels, BLOCK_P)
        valid = in_map[:, None] & in_chans[None, :]
        x = _load(_pointers(x_ptr, batch, row, col, chans, stride_xb, stride_xh, stride_xw), valid)
        grad_ptrs = _pointers(grad_ptr, batch, row, col, chans, stride_gb, stride_gh, stride_gw)
        grad = _load(grad_ptrs, valid)
        a = _activation(x, GELU)
        grad_a = grad
        for tap in range(KERNEL * KERNEL):
            # out[p] takes w a[p + d], d the tap's offset: a[q] gets w grad[q - d], and w gets the sum over p of
            # grad[p] a[p + d], which is that over q of grad[q - d] a[q]: both from the one neighbour tile of grad,
            # and no activation to compute at a neighbour
            dy, dx = _tap_offset(tap, KERNEL)
            inside = valid & _moved_inside(row, col, height, width, -dy, -dx)
            grad_moved = _load_moved(grad_ptrs, inside, stride_gh, stride_gw, -dy, -dx)
            grad_a += _tap_weights(weight_ptr, chans, in_chans, tap, KERNEL) * grad_moved
            grad_weight += tl.where(taps == tap, tl.sum(grad_moved * a, 0)[None, :], 0.0)
        if GELU:
            grad_a *= _gelu_slope(x)
        _store(grad_x_ptr, batch, row, col, chans, stride_dxb, stride_dxh, stride_dxw, grad_a, valid)
        grad_bias += tl.sum(grad, 0)
    _store_partial_sums(partial_ptr + chunk * channels * (KERNEL * KERNEL + 1), grad_weight, grad_bias, chans,
                        in_chans, channels, KERNEL, BLOCK_T)


@triton.jit(do_not_specialize=SIZE_ARGS)
def _gated_conv_kernel(y_ptr, v_ptr, o_ptr, weight_ptr, bias_ptr, out_ptr,
                       stride_yb, stride_yh, stride_yw, stride_vb, stride_vh, stride_vw,
                       stride_ob, stride_oh, stride_ow, stride_outb, stride_outh, stride_outw,
                       channels, height, width, num_pixels,
                       KERNEL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = (y + conv(v) + bias) o for one tile."""
    chans, in_chans = _channel_tile(channels, BLOCK_C)
    batch, row, col, in_map = _pixel_tile(tl.program_id(0), height, width, num_pixels, BLOCK_P)
    valid = in_map[:, None] & in_chans[None, :]
    y = _load(_pointers(y_ptr, batch, row, col, chans, stride_yb, stride_yh, stride_yw), valid)
    o = _load(_pointers(o_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow), valid)
    v = _pointers(v_ptr, batch, row, col, chans, stride_vb, stride_vh, stride_vw)
    branch = y + tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    branch = _plus_depthwise_conv(branch, v, valid, row, col, height, width, stride_vh, stride_vw, weight_ptr, chans,
                                  in_chans, False, KERNEL)
    _store(out_ptr, batch, row, col, chans, stride_outb, stride_outh, stride_outw, branch * o, valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['tiles_per_program'])
def _gated_conv_grad_kernel(y_ptr, v_ptr, o_ptr, grad_ptr, weight_ptr, bias_ptr,
                            grad_y_ptr, grad_v_ptr, grad_o_ptr, partial_ptr,
                            stride_yb, stride_yh, stride_yw, stride_vb, stride_vh, stride_vw,
                            stride_ob, stride_oh, stride_ow, stride_gb, stride_gh, stride_gw,
                            stride_db, stride_dh, stride_dw,
                            channels, height, width, num_pixels, tiles_per_program,
                            KERNEL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                            BLOCK_T: tl.constexpr):
    """grad_y, grad_v and grad_o (all three with the strides stride_d*) of a chunk of tiles_per_program tiles, and
    the chunk's sums of the weight's and bias's gradients."""
    chunk = tl.program_id(0)
    chans, in_chans = _channel_tile(channels, BLOCK_C)
    taps = tl.arange(0, BLOCK_T)[:, None]
    bias = tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    grad_weight = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    grad_bias = tl.zeros((BLOCK_C,), tl.float32)
    for step in range(tiles_per_program):
        batch, row, col, in_map = _pixel_tile(chunk * tiles_per_program + step, height, width, num_pixels, BLOCK_P)
        valid = in_map[:, None] & in_chans[None, :]
        y = _load(_pointers(y_ptr, batch, row, col, chans, stride_yb, stride_yh, stride_yw), valid)
        v_ptrs = _pointers(v_ptr, batch, row, col, chans, stride_vb, stride_vh, stride_vw)
        o_ptrs = _pointers(o_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow)
        grad_ptrs = _pointers(grad_ptr, batch, row, col, chans, stride_gb, stride_gh, stride_gw)
        grad_branch = _load(grad_ptrs, valid) * _load(o_ptrs, valid)
        branch = y + bias
        grad_v = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for tap in range(KERNEL * KERNEL):
            dy, dx = _tap_offset(tap, KERNEL)
            weights = _tap_weights(weight_ptr, chans, in_chans, tap, KERNEL)
            # the branch again (cheaper than saving it), and the weight's gradient from the same tile of v
            inside = valid & _moved_inside(row, col, height, width, dy, dx)
            v_moved = _load_moved(v_ptrs, inside, stride_vh, stride_vw, dy, dx)
            branch += weights * v_moved
            grad_weight += tl.where(taps == tap, tl.sum(grad_branch * v_moved, 0)[None, :], 0.0)
            # v[q] went into the branch at q - d, d the tap's offset
            inside = valid & _moved_inside(row, col, height, width, -dy, -dx)
            grad_branch_moved = (_load_moved(grad_ptrs, inside, stride_gh, stride_gw, -dy, -dx)
                                 * _load_moved(o_ptrs, inside, stride_oh, stride_ow, -dy, -dx))
            grad_v += weights * grad_branch_moved
        grad_o = _load(grad_ptrs, valid) * branch
        _store(grad_y_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_branch, valid)
        _store(grad_v_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_v, valid)
        _store(grad_o_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_o, valid)
        grad_bias += tl.sum(grad_branch, 0)
    _store_partial_sums(partial_ptr + chunk * channels * (KERNEL * KERNEL + 1), grad_weight, grad_bias, chans,
                        in_chans, channels, KERNEL, BLOCK_T)



def _channels_adjacent(t: Tensor) -> Tensor:
    """t, or a channels-last copy where its channels are not adjacent in memory, as the kernels address them."""
    return t if t.stride(1) == 1 else t.contiguous(memory_format=torch.channels_last)


def _map_strides(t: Tensor) -> Tuple[int, int, int]:
    """The batch, row and column strides of a (B, C, H, W) map, as the kernels take them."""
    return t.stride(0), t.stride(2), t.stride(3)


def _channels_last_empty(like: Tensor) -> Tensor:
    """A dense channels-last map of like's shape, dtype and device, unwritten."""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device, memory_format=torch.channels_last)


def _check_shapes(name: str, like: Tensor, weight: Tensor, bias: Tensor):
    kernel = weight.shape[-1]
    if (like.dim() != 4 or weight.shape != (like.shape[1], 1, kernel, kernel) or kernel % 2 == 0
            or bias.shape != (like.shape[1],)):
        raise ValueError(f'{name}: expected (B, C, H, W) maps, a (C, 1, k, k) weight with k odd and a (C,) bias, got '
                         f'{tuple(like.shape)}, {tuple(weight.shape)} and {tuple(bias.shape)}')


def tile_shape(channels: int) -> Tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of a map of ``channels`` channels on a GPU: 1024 elements a tile over 8 warps, 4 a
    thread, which compile without spilling on every GPU Triton serves (tools/compile_kernels.py); 8 elements a thread
    take the gated conv's backward to 184-196 registers. MALA's maps have multiples of 32 channels: no tile half
    empty."""
    block_c = min(32, triton.next_power_of_2(channels))
    return 1024 // block_c, block_c


def variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launchers make (the same on every GPU): the position encoding's
    and the FFN's 3x3 convs, and LePE's 5x5."""
    for kernel_size in (3, 5):
        plan = DepthwisePlan(torch.empty(1, 64, 8, 8), torch.empty(64, 1, kernel_size, kernel_size), gpu)
        if kernel_size == 3:
            for gelu in (False, True):
                yield _residual_conv_kernel, dict(plan.options, GELU=gelu)
                yield _residual_conv_grad_kernel, dict(plan.grad_options, GELU=gelu)
        else:
            yield _gated_conv_kernel, dict(plan.options)
            yield _gated_conv_grad_kernel, dict(plan.grad_options)


class DepthwisePlan:
    """How the kernels of one call split (B, C, H, W) maps: tiles of pixels by channels, for the forward one
    program a tile, for the backward one program a chunk of tiles_per_program tiles."""

    def __init__(self, like: Tensor, weight: Tensor, gpu: GPU):
        batch, self.channels, height, width = like.shape
        num_pixels = batch * height * width
        self.kernel = weight.shape[-1]
        block_p, block_c = tile_shape(self.channels)
        if gpu is INTERPRETER_GPU:
            # Triton's interpreter pays for each operation as well as for each element: there a backbone's maps take
            # at most about eight tiles of pixels (the tests' small maps keep the GPU's tiles and cross their
            # boundaries), which takes its tests' time through these kernels to a third
            block_p = max(block_p, triton.next_power_of_2(triton.cdiv(num_pixels, 8)))
        tiles, channel_tiles = triton.cdiv(num_pixels, block_p), triton.cdiv(self.channels, block_c)
        self.tiles_per_program = max(1, triton.cdiv(tiles, MAX_PARTIAL_ROWS))  # an empty batch has no tiles
        self.num_chunks = triton.cdiv(tiles, self.tiles_per_program)
        self.tile_grid = (tiles, channel_tiles)
        self.chunk_grid = (self.num_chunks, channel_tiles)
        self.sizes = (self.channels, height, width, num_pixels)
        self.options = dict(KERNEL=self.kernel, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=8,
                            maxnreg=registers_a_thread(8))
        # the weight's gradient of a program, one row of taps per channel, padded to a power of two
        self.grad_options = dict(self.options, BLOCK_T=triton.next_power_of_2(self.kernel ** 2))
        self._device = like.device

    def partial_sums(self) -> Tensor:
        """Room for each chunk's sums of the weight's gradient (C k^2 values) and the bias's (C), side by side."""
        return torch.empty((self.num_chunks, self.channels * (self.kernel ** 2 + 1)), dtype=torch.float32,
                           device=self._device)


def _parameter_grads(partial: Tensor, weight: Tensor) -> Tuple[Tensor, Tensor]:
    """The weight's and the bias's gradients: views of the one sum of the chunks' partial sums. The weight's takes
    the weight's strides (those of a contiguous layout, as the kernels read it: channels-last ones are, for one input
    channel), which autograd keeps without a copy."""
    sums = partial.sum(0)
    taps = weight.numel()
    return sums[:taps].as_strided(weight.shape, weight.stride()), sums[taps:]


class _ResidualDepthwiseConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, gelu: bool, torch_fallback: Optional[Callable]):
        x, weight, bias = _channels_adjacent(x), weight.contiguous(), bias.contiguous()
        plan = DepthwisePlan(x, weight, gpu_of(x))
        out = _channels_last_empty(x)
        launch(_residual_conv_kernel, plan.tile_grid, x, weight, bias, out, *_map_strides(x), *_map_strides(out),
               *plan.sizes, GELU=gelu, **plan.options)
        ctx.save_for_backward(x, weight, bias)
        ctx.gelu, ctx.torch_fallback = gelu, torch_fallback
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, bias = ctx.saved_tensors
        grads = in_kernels_or_torch(
            lambda: _residual_conv_grads(x, weight, grad, ctx.gelu), ctx.torch_fallback,
            lambda: torch_gradients(lambda *args: ctx.torch_fallback(*args, ctx.gelu), (x, weight, bias), (grad,)))
        return (*grads, None, None)


def _residual_conv_grads(x: Tensor, weight: Tensor, grad: Tensor, gelu: bool) -> Tuple[Tensor, Tensor, Tensor]:
    grad = _channels_adjacent(grad)
    plan = DepthwisePlan(x, weight, gpu_of(x))
    grad_x, partial = torch.empty_like(x), plan.partial_sums()
    launch(_residual_conv_grad_kernel, plan.chunk_grid, x, grad, weight, grad_x, partial, *_map_strides(x),
           *_map_strides(grad), *_map_strides(grad_x), *plan.sizes, plan.tiles_per_program, GELU=gelu,
           **plan.grad_options)
    return (grad_x, *_parameter_grads(partial, weight))


class _GatedDepthwiseConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                torch_fallback: Optional[Callable]):
        y, v, o = (_channels_adjacent(t) for t in (y, v, o))
        weight, bias = weight.contiguous(), bias.contiguous()
        plan = DepthwisePlan(v, weight, gpu_of(v))
        out = _channels_last_empty(o)
        launch(_gated_conv_kernel, plan.tile_grid, y, v, o, weight, bias, out, *_map_strides(y), *_map_strides(v),
               *_map_strides(o), *_map_strides(out), *plan.sizes, **plan.options)
        ctx.save_for_backward(y, v, o, weight, bias)
        ctx.torch_fallback = torch_fallback
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        inputs = ctx.saved_tensors
        grads = in_kernels_or_torch(lambda: _gated_conv_grads(*inputs, grad), ctx.torch_fallback,
                                    lambda: torch_gradients(ctx.torch_fallback, inputs, (grad,)))
        return (*grads, None)


def _gated_conv_grads(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor, grad: Tensor) -> tuple:
    grad = _channels_adjacent(grad)
    plan = DepthwisePlan(v, weight, gpu_of(v))
    grad_y, grad_v, grad_o = (_channels_last_empty(t) for t in (y, v, o))
    partial = plan.partial_sums()
    launch(_gated_conv_grad_kernel, plan.chunk_grid, y, v, o, grad, weight, bias, grad_y, grad_v, grad_o, partial,
           *_map_strides(y), *_map_strides(v), *_map_strides(o), *_map_strides(grad), *_map_strides(grad_y),
           *plan.sizes, plan.tiles_per_program, **plan.grad_options)
    return (grad_y, grad_v, grad_o, *_parameter_grads(partial, weight))


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool,
                            torch_fallback: Optional[Callable] = None) -> Tensor:
    """``a + conv2d(a, weight, bias, padding=k // 2, groups=C)`` with ``a = GELU(x)`` (exact, erf) or ``a = x``, in
    one launch; its backward takes two.

    Args:
        x: (B, C, H, W) fp32, bf16 or fp16, its channels adjacent in memory (channels-last; other maps are copied
            to channels-last first).
        weight: (C, 1, k, k) depth-wise kernel, k odd, and bias: (C,); both read in their dtype (fp32 parameters,
            under autocast too) and given fp32 gradients, the weight's with its strides.
        gelu: whether the conv and the residual take GELU(x) rather than x.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~.dispatch.Operator` that gives
            the gradients in torch operators instead (called with x, weight, bias and gelu); None: the error stops
            the backward.

    Returns:
        (B, C, H, W) in x's dtype, channels-last. Arithmetic is fp32; x's gradient takes x's dtype and strides.
    """
    _check_shapes('residual_depthwise_conv', x, weight, bias)
    return _ResidualDepthwiseConv.apply(x, weight, bias, gelu, torch_fallback)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                         torch_fallback: Optional[Callable] = None) -> Tensor:
    """``(y + conv2d(v, weight, bias, padding=k // 2, groups=C)) * o`` in one launch; its backward takes two.

    Args:
        y, v, o: (B, C, H, W), fp32, bf16 or fp16 each (not necessarily one dtype), their channels adjacent in memory
            and otherwise any strides: v and o may be channel slices of one channels-last map, read in place (other
            maps are copied to channels-last first).
        weight: (C, 1, k, k) depth-wise kernel, k odd, and bias: (C,); both read in their dtype (fp32 parameters,
            under autocast too) and given fp32 gradients, the weight's with its strides.
        torch_fallback: as in :func:`residual_depthwise_conv` (called with y, v, o, weight and bias).

    Returns:
        (B, C, H, W) in o's dtype, channels-last. Arithmetic is fp32; the gradients of y, v and o take their
        dtypes and are channels-last (B, C, H, W) maps.
    """
    if not y.shape == v.shape == o.shape:
        raise ValueError(f'gated_depthwise_conv: y, v and o must have one shape, got {tuple(y.shape)}, '
                         f'{tuple(v.shape)} and {tuple(o.shape)}')
    _check_shapes('gated_depthwise_conv', v, weight, bias)
    return _GatedDepthwiseConv.apply(y, v, o, weight, bias, torch_fallback)
