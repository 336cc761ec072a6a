"""How the modules and the backbone choose between the operators' implementations, and that they agree: the fused
projection, the attention modules and the backbone's gradients in Triton kernels against torch operators."""
import sys
import types
from typing import List

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mala_mm import MALA
from mala_mm.models import MALAConfigError
from mala_mm.models.layers import MALAttention, QKVOProjection, RoPE2d, SoftmaxAttention
from mala_mm.ops import dispatch
from mala_mm.ops.dispatch import uses_triton
from tests.helpers import feature_loss
from tests.helpers.low_precision import IMPL_MARKS, IMPLS, TRITON_DEVICE

pytestmark = IMPL_MARKS['triton']


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


@pytest.mark.parametrize('impl', IMPLS)
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


@pytest.mark.parametrize('version, usable', [('2.1.0', False), ('3.1.0', False), ('3.2.0', True), ('3.10.1', True)])
def test_a_triton_older_than_the_kernels_need_is_left_unused(monkeypatch, version, usable):
    """torch 2.1's CUDA wheels pin Triton 2.1, which these kernels were never written for: the torch operators
    then serve every device, and impl='triton' says why it cannot run."""
    monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__=version))
    found, missing = dispatch.usable_triton()
    assert (found is not None, missing) == (usable, None if usable else f'Triton {version} is installed')
    monkeypatch.setattr(dispatch, 'TRITON_AVAILABLE', usable)
    monkeypatch.setattr(dispatch, 'TRITON_MISSING', missing)
    if not usable:
        with pytest.raises(MALAConfigError, match=rf"impl='triton': the kernels need Triton 3.2 or newer, and "
                                                  rf"Triton {version} is installed; 'auto' and 'torch' run"):
            MALA(impl='triton')
