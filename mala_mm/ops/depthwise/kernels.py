"""MALA's depth-wise convolutions fused with the elementwise operators around them, in Triton kernels: one a forward
(here), one a backward (:mod:`.grad_kernels`, which also use the helpers here).

- :func:`residual_conv_kernel`, ``a + DWConv(a)`` with ``a = x`` or ``GELU(x)``: a block's position encoding
  (3x3, on the fp32 residual stream) and its FFN's GELU and residual 3x3 conv (on fc1's output).
- :func:`gated_conv_kernel`, ``(y + DWConv(v)) * o``: the attention's exit, the attention's output plus LePE
  (5x5) of the values, gated; v and o are channel slices of the qkvo projection's map, read in place.

Unfused, each is a conv, an add and a GELU or a product, as many launches again in the backward, and the maps
written and read again between them.

A program takes a tile of BLOCK_P pixels (flattened over batch items, rows and columns) by BLOCK_C channels, which
lie side by side in memory in channels-last maps, and runs over the k x k taps, reading each tap's neighbour tile
with the image's border masked: zero padding, and no tap reaches into the next batch item. The taps are a loop at
run time: unrolled, the compiler hoists every tap's loads, and the gated conv's backward spills its registers. The
maps are read in their dtypes (fp32, bf16 or fp16), the
weight and bias as they are (fp32 parameters, under autocast too), and all arithmetic is fp32.

The backward's kernel writes the inputs' gradients and, each program, its sums of the weight's and the bias's
gradients over the pixels it took into its own row of one fp32 workspace; one ``sum(0)`` over the rows gives both,
as views of its result. No atomics: the gradients are the same from run to run.
"""
import triton
import triton.language as tl

from ..triton_helpers import gelu

# sizes that change with every image: Triton would compile a kernel again each time one moved between 1, multiples
# of 16 and other values, with nothing to gain for a size. The strides keep their specialisation: multiples of the
# channels, they keep their divisibility from image to image, and it tells the compiler how the loads align
PIXEL_ARGS = ['height', 'width', 'num_pixels']


@triton.jit
def activation(x, GELU: tl.constexpr):
    if GELU:
        x = gelu(x)
    return x


@triton.jit
def channel_tile(channels, BLOCK_C: tl.constexpr):
    """This program's channels, and which of them the maps have."""
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    return chans, chans < channels


@triton.jit
def pixel_tile(tile, height, width, num_pixels, BLOCK_P: tl.constexpr):
    """The batch item, row and column of each flattened pixel ``(b H + h) W + w`` of a tile, and which pixels the
    maps have."""
    pixels = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    area = height * width
    return pixels // area, pixels % area // width, pixels % width, pixels < num_pixels


@triton.jit
def pointers(ptr, batch, row, col, chans, stride_b, stride_h, stride_w):
    """The (BLOCK_P, BLOCK_C) pointers of a tile of a (B, C, H, W) map whose channel stride is 1."""
    return ptr + (batch * stride_b + row * stride_h + col * stride_w)[:, None] + chans[None, :]


@triton.jit
def load(ptrs, valid):
    """A tile as fp32, zero where not valid."""
    return tl.load(ptrs, mask=valid, other=0.0).to(tl.float32)


@triton.jit
def store(ptr, batch, row, col, chans, stride_b, stride_h, stride_w, value, valid):
    """A tile of a (B, C, H, W) map, in the map's dtype."""
    tl.store(pointers(ptr, batch, row, col, chans, stride_b, stride_h, stride_w), value.to(ptr.dtype.element_ty),
             mask=valid)


@triton.jit
def tap_offset(tap, KERNEL: tl.constexpr):
    """The rows and columns from a pixel to the neighbour that tap ``tap`` (row-major over k x k) weighs."""
    return tap // KERNEL - KERNEL // 2, tap % KERNEL - KERNEL // 2


@triton.jit
def moved_inside(row, col, height, width, dy, dx):
    """(BLOCK_P, 1): whether each pixel of the tile moved dy rows and dx columns stays in its image (the bounds
    moved rather than the indices: four comparisons with scalars, no arithmetic on the tile)."""
    return ((row >= -dy) & (row < height - dy) & (col >= -dx) & (col < width - dx))[:, None]


@triton.jit
def load_moved(ptrs, mask, stride_h, stride_w, dy, dx):
    """The map at each pixel of the tile moved dy rows and dx columns, as fp32; zero where mask is false (outside
    the image: the conv's zero padding)."""
    return tl.load(ptrs + dy * stride_h + dx * stride_w, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def tap_weights(weight_ptr, chans, in_chans, tap, KERNEL: tl.constexpr):
    """The (1, BLOCK_C) weights of one tap of a contiguous (C, 1, k, k) weight."""
    return tl.load(weight_ptr + chans * (KERNEL * KERNEL) + tap, mask=in_chans, other=0.0).to(tl.float32)[None, :]


@triton.jit
def plus_depthwise_conv(acc, ptrs, valid, row, col, height, width, stride_h, stride_w, weight_ptr, chans, in_chans,
                        GELU: tl.constexpr, KERNEL: tl.constexpr):
    """acc + the depth-wise conv of act(map), without bias: the sum over taps of weight * act(neighbour)."""
    for tap in range(KERNEL * KERNEL):
        dy, dx = tap_offset(tap, KERNEL)
        inside = valid & moved_inside(row, col, height, width, dy, dx)
        neighbour = load_moved(ptrs, inside, stride_h, stride_w, dy, dx)
        acc += tap_weights(weight_ptr, chans, in_chans, tap, KERNEL) * activation(neighbour, GELU)
    return acc


@triton.jit
def store_partial_sums(partial_ptr, grad_weight, grad_bias, chans, in_chans, channels,
                       KERNEL: tl.constexpr, BLOCK_T: tl.constexpr):
    """A program's sums of the weight's gradient, (BLOCK_T taps, BLOCK_C) laid out as (C, k^2), and of the bias's,
    (C,) after them, in its row of the workspace."""
    taps = tl.arange(0, BLOCK_T)[:, None]
    tl.store(partial_ptr + chans[None, :] * (KERNEL * KERNEL) + taps, grad_weight,
             mask=(taps < KERNEL * KERNEL) & in_chans[None, :])
    tl.store(partial_ptr + channels * KERNEL * KERNEL + chans, grad_bias, mask=in_chans)


@triton.jit(do_not_specialize=PIXEL_ARGS)
def residual_conv_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, copy_ptr,
                         stride_xb, stride_xh, stride_xw, stride_ob, stride_oh, stride_ow,
                         channels, height, width, num_pixels,
                         GELU: tl.constexpr, COPY: tl.constexpr, KERNEL: tl.constexpr, BLOCK_P: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    """out = a + conv(a) + bias, a = GELU(x) or x, for one tile; where COPY, x also written to copy (out's strides,
    copy's dtype)."""
    chans, in_chans = channel_tile(channels, BLOCK_C)
    batch, row, col, in_map = pixel_tile(tl.program_id(0), height, width, num_pixels, BLOCK_P)
    valid = in_map[:, None] & in_chans[None, :]
    x = pointers(x_ptr, batch, row, col, chans, stride_xb, stride_xh, stride_xw)
    centre = load(x, valid)
    if COPY:
        store(copy_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow, centre, valid)
    out = activation(centre, GELU) + tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    out = plus_depthwise_conv(out, x, valid, row, col, height, width, stride_xh, stride_xw, weight_ptr, chans,
                              in_chans, GELU, KERNEL)
    store(out_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow, out, valid)


@triton.jit(do_not_specialize=PIXEL_ARGS)
def gated_conv_kernel(y_ptr, v_ptr, o_ptr, weight_ptr, bias_ptr, out_ptr,
                      stride_yb, stride_yh, stride_yw, stride_vb, stride_vh, stride_vw,
                      stride_ob, stride_oh, stride_ow, stride_outb, stride_outh, stride_outw,
                      channels, height, width, num_pixels,
                      KERNEL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = (y + conv(v) + bias) o for one tile."""
    chans, in_chans = channel_tile(channels, BLOCK_C)
    batch, row, col, in_map = pixel_tile(tl.program_id(0), height, width, num_pixels, BLOCK_P)
    valid = in_map[:, None] & in_chans[None, :]
    y = load(pointers(y_ptr, batch, row, col, chans, stride_yb, stride_yh, stride_yw), valid)
    o = load(pointers(o_ptr, batch, row, col, chans, stride_ob, stride_oh, stride_ow), valid)
    v = pointers(v_ptr, batch, row, col, chans, stride_vb, stride_vh, stride_vw)
    branch = y + tl.load(bias_ptr + chans, mask=in_chans, other=0.0)[None, :]
    branch = plus_depthwise_conv(branch, v, valid, row, col, height, width, stride_vh, stride_vw, weight_ptr, chans,
                                 in_chans, False, KERNEL)
    store(out_ptr, batch, row, col, chans, stride_outb, stride_outh, stride_outw, branch * o, valid)
