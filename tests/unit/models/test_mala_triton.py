"""MALA attention's Triton kernels against the fp64 formula, and how the backbone chooses between implementations.

The kernels run on the GPU where there is one, else on the CPU in Triton's interpreter (tests/conftest.py). Sizes
cover a padded head width (d = 12, 96), a token count that is not a multiple of the tile, a single token, several
batch items and heads, and a chunked reduction (more tiles than one program takes).
"""
from typing import List

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from tests.helpers import feature_loss
from tests.helpers.low_precision import ATTENTION_IMPLS, IMPL_MARKS, TRITON_DEVICE, attention_impl
from mala_mm import MALA
from mala_mm.models import MALAConfigError
from mala_mm.models.layers import MALAttention, QKVOProjection, RoPE2d, SoftmaxAttention
from mala_mm.ops.mala_attention import mala_attention
from mala_mm.ops.dispatch import uses_triton
from mala_mm.ops.rope import apply_rope, rotate_pair
from mala_tools.reference import relative_error

pytestmark = IMPL_MARKS['triton']

# (batch, heads, height, width, head width)
SHAPES = [(2, 3, 5, 7, 8), (1, 2, 9, 11, 96), (2, 1, 12, 20, 64), (1, 1, 1, 1, 4), (1, 2, 40, 50, 12)]


def shape_id(shape):
    return 'x'.join(map(str, shape))


@pytest.mark.parametrize('with_rope', [False, True], ids=['no RoPE', 'RoPE'])
@pytest.mark.parametrize('shape', SHAPES, ids=shape_id)
def test_fp32_outputs_and_gradients_match_fp64(shape, with_rope):
    batch, heads, height, width, head_dims = shape
    torch.manual_seed(0)
    inputs = [torch.randn(batch, heads, height * width, head_dims, dtype=torch.float64) for _ in range(3)]
    exact_inputs = [t.clone().requires_grad_() for t in inputs]
    fused_inputs = [t.float().requires_grad_() for t in inputs]
    tables = RoPE2d(head_dims).double().tables(height, width, torch.float64) if with_rope else None
    exact = mala_attention(*exact_inputs, tables)
    grad = torch.randn_like(exact)
    exact.backward(grad)
    fused = attention_impl('triton')(*fused_inputs, tables and type(tables)(*(t.float() for t in tables)))
    fused.backward(grad.float())
    assert fused.dtype == torch.float32
    assert relative_error(fused, exact) < 1e-5
    # each gradient relative to the largest of the three: a single token's dq and dk are ~1e-7 of its dv, since its
    # output z / (z + eps) v hardly depends on q and k, and are rounding errors of that size in fp32
    scale = max(t.grad.abs().max().item() for t in exact_inputs)
    for name, ours, exact_input in zip('qkv', fused_inputs, exact_inputs):
        assert (ours.grad.double() - exact_input.grad).abs().max().item() < 1e-5 * scale, name


@pytest.mark.parametrize('arch', [80, 86, 89, 90], ids=lambda arch: f'sm_{arch}')
def test_each_gpus_plan_matches_fp64(arch, monkeypatch):
    """The tiles each GPU's plan takes (the interpreter's own are larger), heads of 64 and of 96 channels (three
    blocks of 32), with RoPE: 7 x 9 tokens cross tiles of 16 and 32, and the tiles cross a chunk's end."""
    from mala_mm.ops.mala_attention import triton_ops as mala_triton
    from mala_mm.ops.triton_launch import GPU
    monkeypatch.setattr(mala_triton, 'gpu_of', lambda t: GPU.of_arch(arch))
    monkeypatch.setattr(mala_triton, 'TARGET_PROGRAMS', 4)  # a head's tokens in two chunks
    for head_dims in (64, 96):
        inputs = [torch.randn(1, 2, 63, head_dims, dtype=torch.float64) for _ in range(3)]
        exact_inputs = [t.clone().requires_grad_() for t in inputs]
        fused_inputs = [t.float().to(TRITON_DEVICE).requires_grad_() for t in inputs]
        tables = RoPE2d(head_dims).double().tables(7, 9, torch.float64)
        exact = mala_attention(*exact_inputs, tables)
        grad = torch.randn_like(exact)
        exact.backward(grad)
        fused = mala_attention(*fused_inputs, type(tables)(*(t.float().to(TRITON_DEVICE) for t in tables)),
                               impl='triton')
        fused.backward(grad.float().to(TRITON_DEVICE))
        assert relative_error(fused.cpu(), exact) < 1e-5
        for ours, expected in zip(fused_inputs, exact_inputs):
            assert relative_error(ours.grad.cpu(), expected.grad) < 1e-5


def test_fused_projection_gives_views_of_one_channels_last_map():
    projection = QKVOProjection(32, 'triton').to(TRITON_DEVICE)
    dense_projection = QKVOProjection(32, 'torch').to(TRITON_DEVICE)
    dense_projection.load_state_dict(projection.state_dict())
    x = torch.randn(2, 32, 6, 9, device=TRITON_DEVICE).contiguous(memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # one conv against four, both in fp32
        views, dense = projection(x), dense_projection(x)
    assert all(t.data_ptr() == views[0].data_ptr() + i * 32 * t.element_size() for i, t in enumerate(views))
    for view, map_ in zip(views, dense):
        torch.testing.assert_close(view, map_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kind', [MALAttention, SoftmaxAttention], ids=['MALA', 'softmax'])
def test_fused_module_matches_unfused(kind):
    torch.manual_seed(0)
    fused = kind(32, 2, impl='triton').to(TRITON_DEVICE)
    unfused = kind(32, 2, impl='torch').to(TRITON_DEVICE)
    unfused.load_state_dict(fused.state_dict())
    x = torch.randn(2, 32, 6, 9, device=TRITON_DEVICE).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    tables = RoPE2d(16).to(TRITON_DEVICE).tables(6, 9)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        outputs = [module(x, tables) for module in (fused, unfused)]
        grads = [torch.autograd.grad(feature_loss([out.cpu()]), [x, *module.parameters()])
                 for out, module in zip(outputs, (fused, unfused))]
    torch.testing.assert_close(*outputs, rtol=1e-5, atol=1e-5)
    for ours, expected in zip(*grads):  # x's, then every parameter's
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_fused_mala_output_is_laid_out_as_a_channels_last_map():
    q, k, v = (torch.randn(2, 3, 20, 8, device=TRITON_DEVICE) for _ in range(3))
    y = mala_attention(q, k, v, impl='triton')
    assert y.transpose(1, 2).is_contiguous()  # (B, N, h, d) in memory: the skeleton views it as (B, C, H, W)


def biases_ahead_of_batch_norm(model: nn.Module) -> List[str]:
    """The conv biases that a BatchNorm in training follows, which subtracts their batch mean again: their gradients
    are zero in exact arithmetic and rounding noise in either implementation."""
    names = []
    for prefix, module in model.named_modules():
        children = list(module.named_children())
        for (name, first), (_, second) in zip(children, children[1:]):
            if isinstance(first, nn.Conv2d) and isinstance(second, _BatchNorm) and first.bias is not None:
                names.append(f'{prefix}.{name}.bias')
    return names


@pytest.mark.parametrize('impl', ATTENTION_IMPLS)
def test_backbone_gradients_agree_between_implementations(impl, small_arch):
    """Every parameter's gradient, under a loss that reaches all of them: a fixed random projection of each output
    (not a function of the outputs' mean squares, which the output LayerNorms fix), with every norm, bias and layer
    scale moved off its initial value."""
    torch.manual_seed(0)
    reference = MALA(arch=small_arch, drop_path_rate=0.0, impl='torch')
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model = MALA(arch=small_arch, drop_path_rate=0.0, impl=impl)
    model.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, 40, 56)
    grads = []
    for m, device in ((reference, torch.device('cpu')), (model, TRITON_DEVICE if impl == 'triton' else 'cpu')):
        m.to(device)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # on CUDA too, fp32 against fp32
            feature_loss([out.cpu() for out in m(x.to(device))]).backward()
        grads.append({name: p.grad.cpu() for name, p in m.named_parameters()})
    left_out = biases_ahead_of_batch_norm(model)
    assert len(left_out) == 7  # the stem's four convs and the three downsamples' one each
    compared = [name for name in grads[0] if name not in left_out]
    for name in compared:
        expected = grads[0][name]
        assert expected.abs().max() > 1e-4, name  # the loss reaches it
        torch.testing.assert_close(grads[1][name], expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item(),
                                   msg=name)


def test_auto_takes_torch_for_cpu_tensors_and_graphs_take_torch():
    x = torch.randn(1, 1, 4, 4)
    assert not uses_triton('auto', x)
    assert uses_triton('auto', x.to(TRITON_DEVICE)) == (TRITON_DEVICE.type == 'cuda')
    assert not uses_triton('torch', x.to(TRITON_DEVICE))
    # a traced graph records torch operators, which ONNX and TorchScript can hold
    attention = MALAttention(16, 1, impl='triton').to(TRITON_DEVICE).eval()
    traced = torch.jit.trace(attention, torch.randn(1, 16, 4, 4, device=TRITON_DEVICE))
    assert 'elu' in str(traced.graph)


def test_attn_impl_is_the_deprecated_name_of_impl(small_arch):
    with pytest.warns(DeprecationWarning, match='"attn_impl" is deprecated in `MALA.__init__`, please use "impl"'):
        model = MALA(arch=small_arch, attn_impl='torch')
    assert {block.impl for block in model.modules() if hasattr(block, 'impl')} == {'torch'}
    with pytest.raises(MALAConfigError, match="impl must be one of"):
        MALA(arch=small_arch, attn_impl='trition')


def test_bad_impl_is_refused_at_construction():
    with pytest.raises(MALAConfigError, match="impl must be one of"):
        MALA(impl='cuda')
    with pytest.raises(TypeError, match='fp32, bf16 or fp16'):
        uses_triton('triton', torch.zeros(1, 1, 2, 4, dtype=torch.float64, device=TRITON_DEVICE))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_rotate_pair_is_apply_rope_on_q_and_k_with_its_gradient(dtype):
    torch.manual_seed(0)
    # strided views, as the fused skeleton hands them over: the heads of one conv's channel slices
    qk = torch.randn(2, 2 * 24, 5, 7, device=TRITON_DEVICE, dtype=dtype).contiguous(memory_format=torch.channels_last)
    q, k = (t.permute(0, 2, 3, 1).reshape(2, 35, 2, 12).transpose(1, 2) for t in qk.chunk(2, dim=1))
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    tables = RoPE2d(12).to(TRITON_DEVICE).tables(5, 7, dtype)
    ours = rotate_pair(q, k, tables, impl='triton')
    grads = [torch.randn_like(t) for t in ours]
    torch.autograd.backward(ours, grads)
    ours_grads = [q.grad, k.grad]
    q.grad = k.grad = None
    expected = [apply_rope(t, tables) for t in (q, k)]
    torch.autograd.backward(expected, grads)
    tolerance = dict(rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).eps)  # one rounding to dtype apart
    for a, b in zip([*ours, *ours_grads], [*expected, q.grad, k.grad]):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, **tolerance)
