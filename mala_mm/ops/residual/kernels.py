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
import triton
import triton.language as tl

# the pixel count changes with every image: Triton would compile again each time it moved between 1, multiples of 16
# and other values
PIXEL_ARGS = ['num_pixels', 'pixels_per_item']


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


@triton.jit(do_not_specialize=PIXEL_ARGS)
def residual_kernel(x_ptr, branch_ptr, gamma_ptr, factors_ptr, weight_ptr, bias_ptr, out_ptr, normed_ptr,
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


@triton.jit(do_not_specialize=PIXEL_ARGS + ['tiles_per_program'])
def residual_grad_kernel(x_ptr, branch_ptr, gamma_ptr, factors_ptr, weight_ptr, grad_ptr, grad_normed_ptr,
                         grad_stream_ptr, grad_branch_ptr, partial_ptr, stride_gb, stride_gp, stride_gc,
                         num_pixels, pixels_per_item, channels, eps, tiles_per_program,
                         HAS_FACTORS: tl.constexpr, NORM: tl.constexpr, SUM_KEPT: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """The gradients of the stream (where NORM: the stream's own plus the LayerNorm's; else it is ``grad`` itself
    and not written) and of the branch, for tiles_per_program tiles; the program's sums of the gradients of gamma,
    and where NORM of the norm's weight and bias, into its row of ``partial`` (3 x channels). The normalised map's
    gradient is read at the strides stride_g* (batch item, pixel, channel). x is the stream before the branch, or
    where SUM_KEPT the sum itself."""
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
        factor = _pixel_factors(factors_ptr, pixels, num_pixels, pixels_per_item, HAS_FACTORS)
        branch = tl.load(branch_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        if NORM:
            x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
            if SUM_KEPT:
                out = x
            else:  # the sum again, as the forward computed it, rather than a copy of it kept from the forward
                out = x + (factor[:, None] * gamma[None, :]) * branch
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
        tl.store(grad_branch_ptr + offsets,
                 (grad * (factor[:, None] * gamma[None, :])).to(grad_branch_ptr.dtype.element_ty), mask=valid)
        grad_gamma += tl.sum(grad * branch * factor[:, None], 0)
    row = partial_ptr + program * 3 * channels
    mask = chans < channels
    tl.store(row + chans, grad_gamma, mask=mask)
    tl.store(row + channels + chans, grad_weight, mask=mask)
    tl.store(row + 2 * channels + chans, grad_bias, mask=mask)
