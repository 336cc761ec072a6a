"""The gradient of GELU after a training BatchNorm, with the norm's output recomputed from its input: one elementwise
Triton kernel over a channels-last map, a program a tile of pixels by channels."""
import triton
import triton.language as tl

from ..triton_helpers import gelu_slope


@triton.jit(do_not_specialize=['num_pixels'])
def gelu_grad_kernel(x_ptr, grad_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr, out_ptr, channels, num_pixels,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = grad GELU'(y), y = (x - mean) invstd weight + bias recomputed in fp32, for one tile of dense
    channels-last maps."""
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_chans = chans < channels
    valid = (pixels < num_pixels)[:, None] & in_chans[None, :]
    offsets = pixels[:, None] * channels + chans[None, :]
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    grad = tl.load(grad_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + chans, mask=in_chans, other=0.0)
    invstd = tl.load(invstd_ptr + chans, mask=in_chans, other=0.0)
    weight = tl.load(weight_ptr + chans, mask=in_chans, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + chans, mask=in_chans, other=0.0).to(tl.float32)
    normed = (x - mean[None, :]) * (invstd * weight)[None, :] + bias[None, :]
    tl.store(out_ptr + offsets, (grad * gelu_slope(normed)).to(out_ptr.dtype.element_ty), mask=valid)
