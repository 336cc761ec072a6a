"""How the Triton operators meet the GPUs they run on, proven without one: each launch on its tensors' device, the
GPU's properties read once, 'auto' on GPUs Triton does not serve, and a kernel that fails on a user's GPU.

torch.cuda's answers (properties, the current device, the device context) are mocked; the kernels run on the GPU
where there is one, else in Triton's interpreter (tests/conftest.py).
"""

import pytest
import torch

from mala_mm import MALA
from mala_mm.ops import OPERATORS, TRITON_AVAILABLE, dispatch
from mala_mm.ops.mala_attention import mala_attention
from tests.helpers import SMALL_ARCH, feature_loss, ignore_interpreter_deprecation, warnings_as_errors
from tests.helpers.launches import failing_kernel, kernel_name_of, patch_launcher
from tests.helpers.low_precision import IMPL_MARKS, TRITON_DEVICE

if TRITON_AVAILABLE:  # a Triton the kernels run on; else IMPL_MARKS skips these tests
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    from mala_mm.ops import triton_launch
else:
    triton_launch = None

pytestmark = IMPL_MARKS['triton']

KIB = 1024


class Properties:
    """What torch.cuda.get_device_properties tells of a GPU (torch before 2.6 has no opt-in shared memory)."""

    def __init__(self, name: str, major: int, minor: int, shared_kib_per_sm: int):
        self.name, self.major, self.minor = name, major, minor
        self.shared_memory_per_multiprocessor = shared_kib_per_sm * KIB


A100, RTX_4090, T4 = Properties('NVIDIA A100', 8, 0, 164), Properties('RTX 4090', 8, 9, 100), \
    Properties('Tesla T4', 7, 5, 64)


@pytest.fixture
def gpus(monkeypatch):
    """A machine whose torch.cuda shows the GPUs of the dict the test fills, by index, read afresh."""
    installed = {}
    reads = []

    def properties(index):
        reads.append(index)
        return installed[index]
    monkeypatch.setattr(torch.cuda, 'get_device_properties', properties)
    triton_launch.cuda_gpu.cache_clear()
    yield installed, reads
    triton_launch.cuda_gpu.cache_clear()


class CudaLike:
    """What dispatch asks of a CUDA tensor: where it lies and its dtype."""
    is_cuda = True
    dtype = torch.float32

    def __init__(self, index: int = 0):
        self.device = torch.device('cuda', index)


def test_each_gpu_is_read_once_with_its_shared_memory(gpus):
    installed, reads = gpus
    installed.update({0: A100, 1: RTX_4090})
    assert triton_launch.cuda_gpu(0) == triton_launch.GPU('NVIDIA A100', (8, 0), 163 * KIB)
    assert triton_launch.cuda_gpu(1).shared_memory == 99 * KIB  # what a block may opt in to, as Triton checks
    triton_launch.cuda_gpu(0)
    assert reads == [0, 1]
    # the same figures as the table compile_kernels.py checks the plans against
    assert triton_launch.cuda_gpu(0).shared_memory == triton_launch.GPU.of_arch(80).shared_memory


def test_auto_takes_torch_on_a_gpu_triton_does_not_serve_and_says_so_once(gpus, monkeypatch):
    installed, _ = gpus
    installed.update({0: T4, 1: A100})
    logged = []
    monkeypatch.setattr(dispatch, 'print_log', lambda message, **_: logged.append(message))
    monkeypatch.setattr(dispatch, 'GPUS_LOGGED', set())
    assert not dispatch.uses_triton('auto', CudaLike(0))
    assert not dispatch.uses_triton('auto', CudaLike(0))
    assert len(logged) == 1 and 'Tesla T4' in logged[0] and '8.0' in logged[0]
    assert dispatch.uses_triton('auto', CudaLike(1))
    with pytest.raises(RuntimeError, match=r"Tesla T4 \(compute capability 7\.5\).*impl='auto'.*or 'torch'"):
        dispatch.uses_triton('triton', CudaLike(0))


def test_an_unknown_impl_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'triton', 'torch'\), got 'trition'"):
        mala_attention(*(torch.randn(1, 1, 4, 8) for _ in range(3)), impl='trition')


def test_every_launch_runs_on_its_tensors_device(gpus, monkeypatch):
    """Tensors on cuda:1 while cuda:0 is current: every kernel, forward and backward, launches with cuda:1 current,
    whose current stream Triton then takes."""
    installed, _ = gpus
    installed.update({0: A100, 1: A100})
    current = [0]

    class DeviceContext:  # torch.cuda.device, switching the mocked current device
        def __init__(self, device):
            self.index = torch.device(device).index

        def __enter__(self):
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *_):
            current[0] = self.previous

    launched_on = []

    def recorded(launcher):
        def launch(kernel, grid):
            launched_on.append((kernel_name_of(kernel), current[0]))
            return launcher(kernel, grid)
        return launch
    monkeypatch.setattr(torch.cuda, 'device', DeviceContext)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: current[0])
    monkeypatch.setattr(triton_launch, 'launch_device', lambda t: torch.device('cuda', 1))
    patch_launcher(monkeypatch, recorded)
    model = MALA(arch=SMALL_ARCH, impl='triton').to(TRITON_DEVICE)
    feature_loss([out.cpu() for out in model(torch.randn(2, 3, 32, 32, device=TRITON_DEVICE))]).backward()
    assert {name for name, _ in launched_on} == {
        'state_kernel', 'output_kernel', 'query_grad_kernel', 'key_value_grad_kernel', 'rotate_qk_kernel',
        'residual_conv_kernel', 'residual_conv_grad_kernel', 'gated_conv_kernel', 'gated_conv_grad_kernel',
        'residual_kernel', 'residual_grad_kernel', 'gelu_grad_kernel'}
    assert {device for _, device in launched_on} == {1}


@pytest.fixture
def auto_on_a_gpu(monkeypatch):
    """'auto' as on a GPU that Triton serves, on the kernels' device here; the operator's record of failures
    fresh."""
    gpu = triton_launch.gpu_of(torch.empty(0, device=TRITON_DEVICE))
    monkeypatch.setattr(dispatch, 'uses_triton', lambda impl, x, operator=None: impl == 'triton' or (
        impl == 'auto' and (operator is None or operator.available_on(gpu))))
    monkeypatch.setattr(OPERATORS['mala_attention'], 'failed_on', set())
    monkeypatch.setattr(OPERATORS['mala_attention'], 'failing_on', set())
    return gpu


@pytest.mark.parametrize('error', [
    pytest.param(lambda: OutOfResources(180224, 101376, 'shared memory'), id='OutOfResources'),
    pytest.param(lambda: CompilationError('', None, 'unsupported on this GPU'), id='CompilationError'),
    pytest.param(lambda: RuntimeError('Triton Error [CUDA]: device kernel image is invalid'), id='driver')])
def test_what_compiling_loading_or_launching_raises_falls_back(auto_on_a_gpu, monkeypatch, error):
    failing_kernel(monkeypatch, 'output_kernel', error())
    with pytest.warns(RuntimeWarning, match='output_kernel'):
        ignore_interpreter_deprecation()  # else pytest.warns shows it again
        out = mala_attention(*attention_inputs(), impl='auto')
    assert out.shape == (2, 2, 30, 16)


@pytest.mark.parametrize('error', [TypeError, ValueError, IndexError, AttributeError])
def test_an_error_of_our_own_code_stops_the_run_under_auto_too(auto_on_a_gpu, monkeypatch, error):
    """A bug in a launcher or in what it hands a kernel is not a GPU's limit: falling back would hide it."""
    failing_kernel(monkeypatch, 'state_kernel', error('a launcher bug'))
    with warnings_as_errors():  # no fallback warning
        with pytest.raises(error, match='a launcher bug'):
            mala_attention(*attention_inputs(), impl='auto')
    assert OPERATORS['mala_attention'].available_on(auto_on_a_gpu)


def test_without_gradients_a_failed_kernel_is_left_at_once(auto_on_a_gpu, monkeypatch):
    """No backward can follow an inference forward, and nothing recomputes it: the torch operators take over
    at once."""
    tried = failing_kernel(monkeypatch, 'output_kernel')
    with torch.no_grad(), pytest.warns(RuntimeWarning, match='output_kernel'):
        ignore_interpreter_deprecation()  # else pytest.warns shows it again
        mala_attention(*attention_inputs(), impl='auto')
    tried.clear()
    with torch.no_grad():
        mala_attention(*attention_inputs(), impl='auto')
    assert tried == [] and not OPERATORS['mala_attention'].available_on(auto_on_a_gpu)


def attention_inputs():
    return [torch.randn(2, 2, 30, 16, device=TRITON_DEVICE, requires_grad=True) for _ in range(3)]


def test_auto_falls_back_to_torch_where_a_forward_kernel_fails(auto_on_a_gpu, monkeypatch):
    tried = failing_kernel(monkeypatch, 'output_kernel')
    inputs = attention_inputs()
    with pytest.warns(RuntimeWarning) as warned:
        ignore_interpreter_deprecation()
        out = mala_attention(*inputs, impl='auto')
    assert len(warned) == 1
    message = str(warned[0].message)
    assert 'output_kernel' in message and str(auto_on_a_gpu) in message and 'Hardware limit' in message
    torch.testing.assert_close(out, mala_attention(*inputs, impl='torch'))
    tried.clear()
    with warnings_as_errors():  # said once
        # until the step's backward has run, the kernels are still tried, so that a checkpointed block recomputes
        # what its forward ran (tests/unit/ops/test_fallback.py)
        torch.testing.assert_close(mala_attention(*inputs, impl='auto'), out)
        assert tried == ['state_kernel', 'output_kernel']
        out.sum().backward()
        tried.clear()
        mala_attention(*inputs, impl='auto')
    assert tried == []  # the torch operators from then on
    with pytest.raises(triton_launch.KernelUnavailable, match='output_kernel'):
        mala_attention(*inputs, impl='triton')  # asked for by name, the error stops the run


def test_auto_takes_the_gradients_in_torch_where_a_backward_kernel_fails(auto_on_a_gpu, monkeypatch):
    failing_kernel(monkeypatch, 'key_value_grad_kernel')
    inputs = attention_inputs()
    grad = torch.randn(2, 2, 30, 16, device=TRITON_DEVICE)
    out = mala_attention(*inputs, impl='auto')
    with pytest.warns(RuntimeWarning, match='key_value_grad_kernel'):
        ignore_interpreter_deprecation()  # else pytest.warns shows it again
        ours = torch.autograd.grad(out, inputs, grad)
    expected = torch.autograd.grad(mala_attention(*inputs, impl='torch'), inputs, grad)
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not OPERATORS['mala_attention'].available_on(auto_on_a_gpu)
