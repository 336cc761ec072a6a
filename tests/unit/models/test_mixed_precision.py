"""MALA under bf16 and fp16 autocast: the attention against its explicit N x N form in fp64
(:mod:`mala_mm.ops.mala_attention.naive`), the backbone against fp32.

An error is the largest absolute deviation over the largest absolute value of the reference, and a tolerance is
a multiple of the format's machine epsilon (bf16 2^-7, fp16 2^-10). The error is normalised by the tensor's
largest value, not element by element, because that is how low-precision arithmetic errs: a matmul rounds its
operands and its sums relative to their magnitude, so an output element that is small because large terms
cancel (an output crossing zero, say) carries the absolute error of those terms, and its own relative error is
unbounded however exact the arithmetic. Outputs whose exact value exceeds fp16's range (65504) or lies below its
smallest number (6e-8) cannot be represented in fp16; such cases run in bf16 only or are checked for finiteness
alone, as noted where they occur.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

from mala_mm import MALA
from mala_mm.models.layers import MALAttention, RoPE2d
from mala_mm.ops.mala_attention import mala_attention, naive
from mala_tools import reference
from tests.helpers import SMALL_ARCH, feature_loss, relative_error
from tests.helpers.low_precision import (DTYPES, IMPL_MARKS, IMPLS, LOW_PRECISIONS, MARKS, NAMES, NEEDS_CPU_FP16,
                                         TRITON_DEVICE, attention_impl)

# torch 2.1.2's CPU scaled_dot_product_attention aborts the process in its bfloat16 backward ("double free or
# corruption"), whatever the model around it; 2.13 does not (the versions between are unmeasured)
SDPA_BF16_BACKWARD_ABORTS = torch.__version__.startswith('2.1.')
FP16_MAX = torch.finfo(torch.float16).max

# A few roundings of the low-precision matmuls' operands and results.
GENERAL = 4
# Where every query weighs the keys alike, y_i = (1 + z_i) A_i - z_i mean(v) with the attention average
# A_i ~ mean(v) and z_i ~ d^1/2 = 4: the first term, rounded in low precision, is about 1 + z_i times y_i.
UNIFORM = 8
# The stem and the 12 blocks of 'tiny' each add about one rounding of their output to the error of what they
# take in, which the residual connections carry on: about 12 roundings at the last stage.
BACKBONE = 12

B, HEADS, H, W, D = 2, 2, 8, 8, 16
N = H * W


def tolerance(dtype, epsilons):
    return epsilons * torch.finfo(dtype).eps


def randn(*shape):
    return torch.randn(*shape) if shape else torch.randn(B, HEADS, N, D)


def constant_tokens(x):
    return x[..., :1, :].expand_as(x)


def exact_mala_attention(q, k, v, height, width):
    """The explicit N x N formula in fp64 on the values of q, k, v as given (rounded to low precision or not)."""
    tables = RoPE2d(q.shape[-1]).tables(height, width, torch.float64)
    return naive.mala_attention(q.double(), k.double(), v.double(), tables)


# Each builds q, k, v in fp32, the map size and the tolerance in machine epsilons.
ATTENTION_CASES = {
    'random': lambda: (randn(), randn(), randn(), (H, W), GENERAL),
    'q, k, v x 1e-4': lambda: (1e-4 * randn(), 1e-4 * randn(), 1e-4 * randn(), (H, W), UNIFORM),
    'q, k, v x 1e4': lambda: (1e4 * randn(), 1e4 * randn(), 1e4 * randn(), (H, W), GENERAL),  # y ~ 1e11
    'q x 1e-4': lambda: (1e-4 * randn(), randn(), randn(), (H, W), GENERAL),
    'k x 1e-4': lambda: (randn(), 1e-4 * randn(), randn(), (H, W), GENERAL),
    'v x 1e-4': lambda: (randn(), randn(), 1e-4 * randn(), (H, W), GENERAL),
    'q x 1e4': lambda: (1e4 * randn(), randn(), randn(), (H, W), GENERAL),
    'k x 1e4': lambda: (randn(), 1e4 * randn(), randn(), (H, W), GENERAL),
    'v x 1e4': lambda: (randn(), randn(), 1e4 * randn(), (H, W), GENERAL),
    # phi(q) ~ 6e-6: z ~ 1e-5 is near eps and beta = 1 + 1 / (z + eps) ~ 1e5
    'q near -12': lambda: (randn() - 12, randn(), randn(), (H, W), GENERAL),
    # z from ~1 down to far below eps, where a row's weights sum to z / (z + eps) instead of 1
    'q in [-30, 0]': lambda: (-30 * torch.rand(B, HEADS, N, D), randn(), randn(), (H, W), GENERAL),
    'k near -12': lambda: (randn(), randn() - 12, randn(), (H, W), GENERAL),
    'constant tokens': lambda: (*(constant_tokens(randn()) for _ in range(3)), (H, W), UNIFORM),
    'q, k zero': lambda: (torch.zeros(B, HEADS, N, D), torch.zeros(B, HEADS, N, D), randn(), (H, W), UNIFORM),
    'one token': lambda: (randn(B, HEADS, 1, D), randn(B, HEADS, 1, D), randn(B, HEADS, 1, D), (1, 1), UNIFORM),
    # sum_j k_j^T v_j over 128^2 tokens is far beyond fp16's range
    '128 x 128 tokens': lambda: (randn(1, 1, 128 * 128, 32), randn(1, 1, 128 * 128, 32),
                                 40 + randn(1, 1, 128 * 128, 32), (128, 128), GENERAL),
}
BEYOND_FP16 = {'q, k, v x 1e4'}
# the fp16 range of the torch path's low-precision matmuls: the Triton kernels compute in fp32 (and take about 10 s
# for it in Triton's interpreter)
TORCH_PATH_ONLY = {'128 x 128 tokens'}


@pytest.mark.parametrize('impl,dtype,case', [
    pytest.param(impl, dtype, case, id=f'{impl}-{NAMES[dtype]}-{case}',
                 marks=[mark for mark in (MARKS.get(dtype), IMPL_MARKS.get(impl)) if mark is not None])
    for impl in ('torch', 'triton') for dtype in LOW_PRECISIONS for case in ATTENTION_CASES
    if not (dtype is torch.float16 and case in BEYOND_FP16) and not (impl == 'triton' and case in TORCH_PATH_ONLY)])
def test_mala_attention_in_low_precision_matches_exact_formula(impl, dtype, case):
    q, k, v, (height, width), epsilons = ATTENTION_CASES[case]()
    q, k, v = (t.to(dtype) for t in (q, k, v))  # as autocast's projections hand them over
    # the exact formula on the same rounded inputs: the tolerance measures the arithmetic alone
    exact = exact_mala_attention(q, k, v, height, width)
    with torch.autocast('cpu', dtype=dtype):
        low = attention_impl(impl)(q, k, v, RoPE2d(q.shape[-1]).tables(height, width, dtype))
    assert low.dtype == dtype and torch.isfinite(low).all()
    assert relative_error(low, exact) < tolerance(dtype, epsilons)


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('dtype', DTYPES)
def test_mala_attention_of_all_zero_inputs_is_exactly_zero(dtype, impl):
    zeros = torch.zeros(B, HEADS, N, D, dtype=dtype)
    with torch.autocast('cpu', dtype=dtype):
        y = attention_impl(impl)(zeros, zeros, zeros, RoPE2d(D).tables(H, W, dtype))
    assert torch.equal(y, torch.zeros_like(y))


@NEEDS_CPU_FP16
def test_fp16_autocast_keeps_outputs_beyond_fp16_range_accurate_in_fp32():
    # fp32 inputs keep the output in fp32; the fp16 matmuls in between see operands of unit scale
    q, k, v = (1e4 * randn() for _ in range(3))
    exact = exact_mala_attention(q, k, v, H, W)
    assert exact.abs().max() > 1e3 * FP16_MAX
    with torch.autocast('cpu', dtype=torch.float16):
        low = mala_attention(q, k, v, RoPE2d(D).tables(H, W, torch.float16))
    assert low.dtype == torch.float32
    assert relative_error(low, exact) < tolerance(torch.float16, GENERAL)


@pytest.mark.parametrize('case', ['random', 'q, k, v x 1e-4', 'q near -12', 'q in [-30, 0]'])
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('impl', IMPLS)
def test_mala_attention_gradients_in_low_precision_match_exact_formula(impl, dtype, case):
    # d beta / d z = -1 / z^2 is ~1e10 for queries near -12: the gradient must pass through it in fp32
    q, k, v, (height, width), epsilons = ATTENTION_CASES[case]()
    weights = randn()
    low_inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    exact_inputs = [t.detach().double().requires_grad_() for t in low_inputs]
    with torch.autocast('cpu', dtype=dtype):
        low = attention_impl(impl)(*low_inputs, RoPE2d(D).tables(height, width, dtype))
    (low.float() * weights).sum().backward()
    exact = exact_mala_attention(*exact_inputs, height, width)
    (exact * weights.double()).sum().backward()
    for ours, exact_input in zip(low_inputs, exact_inputs):
        assert torch.isfinite(ours.grad).all()
        assert relative_error(ours.grad, exact_input.grad) < tolerance(dtype, epsilons)


# The module's output grows as the cube of its input (q, k and v are each linear in it).
MODULE_INPUTS = {
    'random': lambda x: x,
    'x 1e-4': lambda x: 1e-4 * x,
    'x 1e4': lambda x: 1e4 * x,  # outputs ~1e14
    'constant': lambda x: x[..., :1, :1].expand_as(x),
    'zero': torch.zeros_like,
}


@pytest.mark.parametrize('dtype,case', [pytest.param(dtype, case, id=f'{NAMES[dtype]}-{case}',
                                                     marks=MARKS.get(dtype, ()))
                                        for dtype in LOW_PRECISIONS for case in MODULE_INPUTS
                                        if not (dtype is torch.float16 and case == 'x 1e4')])
@pytest.mark.parametrize('impl', IMPLS)
def test_mala_attention_module_under_autocast_matches_fp64(impl, dtype, case):
    channels, heads = 32, 2
    attn = MALAttention(channels, heads, impl=impl)
    x = MODULE_INPUTS[case](torch.randn(2, channels, 9, 11))
    frequencies = RoPE2d(channels // heads).angle.double()
    device = TRITON_DEVICE if impl == 'triton' else torch.device('cpu')
    with torch.no_grad():
        # the reference's skeleton and explicit formula on the module's weights, in fp64
        exact = reference.gated_attention(copy.deepcopy(attn).double(), x.double(), frequencies)
        with torch.autocast(device.type, dtype=dtype):
            low = attn.to(device)(x.to(device), RoPE2d(channels // heads).to(device).tables(9, 11)).cpu()
    assert low.dtype == dtype and torch.isfinite(low).all()
    assert relative_error(low, exact) < tolerance(dtype, UNIFORM)


IMAGE_SIZE = 48  # the last stage still sees 2 x 2 tokens


def natural_image(scale=1.0):
    """Smooth structure plus fine texture, values within about +-3 like a normalised photo."""
    coarse = F.interpolate(torch.randn(2, 3, 6, 6), size=IMAGE_SIZE, mode='bilinear', align_corners=False)
    return scale * (coarse + 0.1 * torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE))


IMAGES = {
    'natural': natural_image,
    'constant': lambda: torch.full((2, 3, IMAGE_SIZE, IMAGE_SIZE), 0.7),
    'zero': lambda: torch.zeros(2, 3, IMAGE_SIZE, IMAGE_SIZE),
    'x 1000': lambda: natural_image(1000),
    'x 1e-3': lambda: natural_image(1e-3),
}


@pytest.fixture(scope='module')
def backbones():
    """'tiny' initialised as released (zero biases) and a small arch with PyTorch's default initialisation,
    whose non-zero biases give an all-zero image non-zero features; both in eval mode."""
    torch.manual_seed(0)
    tiny = MALA(arch='tiny')
    tiny.init_weights()
    return {'tiny': tiny.eval(), 'small': MALA(arch=dict(SMALL_ARCH)).eval()}


# Under the release's initialisation (weights of std 0.02, zero biases) a 1e-3 image leaves the stem at ~2e-6, among
# fp16's subnormals, and the first attention at ~1e-9, below fp16's smallest number: fp16 can only stay finite there.
BELOW_FP16 = {('tiny', 'x 1e-3')}


@pytest.mark.parametrize('image', list(IMAGES))
@pytest.mark.parametrize('arch', ['tiny', 'small'])
@pytest.mark.parametrize('dtype', DTYPES)
def test_backbone_under_autocast_stays_close_to_fp32(backbones, dtype, arch, image):
    model = backbones[arch]
    x = IMAGES[image]()
    with torch.no_grad():
        reference = model(x)
        with torch.autocast('cpu', dtype=dtype):
            low = model(x)
    for ours, exact in zip(low, reference):
        assert torch.isfinite(ours).all()
        if not (dtype is torch.float16 and (arch, image) in BELOW_FP16):
            assert relative_error(ours, exact) < tolerance(dtype, BACKBONE)


@pytest.mark.parametrize('image', ['natural', 'x 1000', 'constant'])
@pytest.mark.parametrize('arch', ['tiny', 'small'])
@pytest.mark.parametrize('dtype', DTYPES)
def test_backbone_backward_under_autocast_reaches_every_parameter(backbones, dtype, arch, image):
    if dtype == torch.bfloat16 and SDPA_BF16_BACKWARD_ABORTS:
        pytest.skip("torch 2.1's CPU scaled_dot_product_attention aborts the process in its bfloat16 backward")
    # in eval mode, so that no block is dropped and every parameter has a gradient
    model = copy.deepcopy(backbones[arch])
    with torch.autocast('cpu', dtype=dtype):
        outputs = model(IMAGES[image]())
    feature_loss(outputs).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and (param.grad != 0).any(), name


def test_only_normalisation_statistics_are_averaged_across_processes():
    from mala_mm.engine.hooks import norm_statistics
    model = MALA(SMALL_ARCH, norm_cfg=dict(type='BN'))
    averaged = {id(buffer) for buffer in norm_statistics(model)}
    names = {name for name, buffer in model.named_buffers() if id(buffer) in averaged}
    assert names and all(name.endswith(('running_mean', 'running_var')) for name in names)
    assert not any(name.endswith('RoPE.angle') for name in names)
    assert len(names) == 2 * sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


# Stage 0 of a 1333 x 800 COCO image: 200 x 334 tokens, MALA-T's 64 channels in one head.
STAGE0_TOKENS = (200, 334)


@pytest.mark.slow
@pytest.mark.parametrize('loss_scale', [512., 2.**16], ids=['release 512', 'dynamic start 2^16'])
@NEEDS_CPU_FP16
def test_fp16_backward_at_the_paper_size_is_finite(loss_scale):
    """The backward of one MALA attention under fp16 autocast at the paper's stage-0 size, with the loss scaled
    as the release's static scaler (512) and as a dynamic scaler starts (2^16): every gradient finite and
    non-zero. The loss is a random-weighted mean of the output, as a detector's averaged losses are. The powers of
    two that bring q, k, v to unit size in the fp16 matmuls multiply the gradient entering them by the same
    factors, the risk this guards against (docs/reliability.md has the scale at which it first overflows)."""
    torch.manual_seed(0)
    height, width = STAGE0_TOKENS
    attention = MALAttention(64, 1)
    x = torch.randn(1, 64, height, width, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.float16):
        y = attention(x, RoPE2d(64).tables(height, width))
    (feature_loss([y]) * loss_scale).backward()
    for name, grad in [('input', x.grad), *((n, p.grad) for n, p in attention.named_parameters())]:
        assert torch.isfinite(grad).all() and (grad != 0).any(), name
