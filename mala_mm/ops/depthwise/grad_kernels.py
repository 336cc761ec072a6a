"""The backward of the fused depth-wise convolutions (:mod:`.kernels`): a program takes a chunk of pixel tiles, writes
the inputs' gradients and sums the weight's and the bias's over its pixels into its own row of one fp32 workspace."""
import triton
import triton.language as tl

from ..triton_helpers import gelu_slope
from .kernels import (PIXEL_ARGS, activation, channel_tile, load, load_moved, moved_inside, pixel_tile, pointers, store,
                      store_partial_sums, tap_offset, tap_weights)


@triton.jit(do_not_specialize=PIXEL_ARGS + ['tiles_per_program'])
def residual_conv_grad_kernel(x_ptr, grad_ptr, weight_ptr, grad_x_ptr, partial_ptr,
                              stride_xb, stride_xh, stride_xw, stride_gb, stride_gh, stride_gw,
                              stride_dxb, stride_dxh, stride_dxw,
                              channels, height, width, num_pixels, tiles_per_program,
                              GELU: tl.constexpr, KERNEL: tl.constexpr, BLOCK_P: tl.constexpr,
                              BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """grad_x of a chunk of tiles_per_program tiles, and the chunk's sums of the weight's and bias's gradients."""
    chunk = tl.program_id(0)
    chans, in_chans = channel_tile(channels, BLOCK_C)
    taps = tl.arange(0, BLOCK_T)[:, None]
    grad_weight = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    grad_bias = tl.zeros((BLOCK_C,), tl.float32)
    for step in range(tiles_per_program):
        batch, row, col, in_map = pixel_tile(chunk * tiles_per_program + step, height, width, num_pixels, BLOCK_P)
        valid = in_map[:, None] & in_chans[None, :]
        x = load(pointers(x_ptr, batch, row, col, chans, stride_xb, stride_xh, stride_xw), valid)
        grad_ptrs = pointers(grad_ptr, batch, row, col, chans, stride_gb, stride_gh, stride_gw)
        grad = load(grad_ptrs, valid)
        a = activation(x, GELU)
        grad_a = grad
        for tap in range(KERNEL * KERNEL):
            # out[p] takes w a[p + d], d the tap's offset: a[q] gets w grad[q - d], and w gets the sum over p of
            # grad[p] a[p + d], which is that over q of grad[q - d] a[q]: both from the one neighbour tile of grad,
            # and no activation to compute at a neighbour
            dy, dx = tap_offset(tap, KERNEL)
            inside = valid & moved_inside(row, col, height, width, -dy, -dx)
            grad_moved = load_moved(grad_ptrs, inside, stride_gh, stride_gw, -dy, -dx)
            grad_a += tap_weights(weight_ptr, chans, in_chans, tap, KERNEL) * grad_moved
            grad_weight += tl.where(taps == tap, tl.sum(grad_moved * a, 0)[None, :], 0.0)
        if GELU:
            grad_a *= gelu_slope(x)
        store(grad_x_ptr, batch, row, col, chans, stride_dxb, stride_dxh, stride_dxw, grad_a, valid)
        grad_bias += tl.sum(grad, 0)
    store_partial_sums(partial_ptr + chunk * channels * (KERNEL * KERNEL + 1), grad_weight, grad_bias, chans,
                       in_chans, channels, KERNEL, BLOCK_T)


@triton.jit(do_not_specialize=PIXEL_ARGS + ['tiles_per_program'])
def gated_conv_grad_kernel(y_ptr, v_ptr, o_ptr, grad_ptr, weight_ptr, bias_ptr,
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
    chans, in_chans = channel_tile(channels, BLOCK_C)
    taps = tl.arange(0, BLOCK_T)[:, None]
    bias = tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    grad_weight = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    grad_bias = tl.zeros((BLOCK_C,), tl.float32)
    for step in range(tiles_per_program):
        batch, row, col, in_map = pixel_tile(chunk * tiles_per_program + step, height, width, num_pixels, BLOCK_P)
        valid = in_map[:, None] & in_chans[None, :]
        y = load(pointers(y_ptr, batch, row, col, chans, stride_yb, stride_yh, stride_yw), valid)
        v_ptrs = pointers(v_ptr, batch, row, col, chans, stride_vb, stride_vh, stride_vw)
        o_ptrs = pointers(o_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow)
        grad_ptrs = pointers(grad_ptr, batch, row, col, chans, stride_gb, stride_gh, stride_gw)
        grad_branch = load(grad_ptrs, valid) * load(o_ptrs, valid)
        branch = y + bias
        grad_v = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for tap in range(KERNEL * KERNEL):
            dy, dx = tap_offset(tap, KERNEL)
            weights = tap_weights(weight_ptr, chans, in_chans, tap, KERNEL)
            # the branch again (cheaper than saving it), and the weight's gradient from the same tile of v
            inside = valid & moved_inside(row, col, height, width, dy, dx)
            v_moved = load_moved(v_ptrs, inside, stride_vh, stride_vw, dy, dx)
            branch += weights * v_moved
            grad_weight += tl.where(taps == tap, tl.sum(grad_branch * v_moved, 0)[None, :], 0.0)
            # v[q] went into the branch at q - d, d the tap's offset
            inside = valid & moved_inside(row, col, height, width, -dy, -dx)
            grad_branch_moved = (load_moved(grad_ptrs, inside, stride_gh, stride_gw, -dy, -dx)
                                 * load_moved(o_ptrs, inside, stride_oh, stride_ow, -dy, -dx))
            grad_v += weights * grad_branch_moved
        grad_o = load(grad_ptrs, valid) * branch
        store(grad_y_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_branch, valid)
        store(grad_v_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_v, valid)
        store(grad_o_ptr, batch, row, col, chans, stride_db, stride_dh, stride_dw, grad_o, valid)
        grad_bias += tl.sum(grad_branch, 0)
    store_partial_sums(partial_ptr + chunk * channels * (KERNEL * KERNEL + 1), grad_weight, grad_bias, chans,
                       in_chans, channels, KERNEL, BLOCK_T)
