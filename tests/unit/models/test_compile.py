"""The compiled backbone, ``MALA(compile=...)``: one graph without breaks per kind of block, equal to eager across
training sizes and as close to fp32 as eager under autocast."""
import copy

import pytest
import torch
from torch._dynamo.utils import counters

from mala_mm import MALA
from mala_mm.models import MALAConfigError
from tests.helpers import NEEDS_CUSTOM_OPS

# the released layout of heads (1, 2, 4, 4 of width 16) at a width that compiles and runs in seconds; its last two
# stages have blocks alike (softmax attention, 64 channels, 4 heads), so it has three kinds of block
NARROW = dict(embed_dims=[16, 32, 64, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 4])
NARROW_BLOCK_KINDS = 3
# padded batch sizes of the 3x recipe's multi-scale training (short side 480..800 in steps of 32, long side <= 1333,
# or a 384..600 crop resized so; padded to multiples of 32)
RECIPE_SIZES = [(480, 736), (800, 1344), (576, 864), (704, 1056), (512, 512), (640, 1152)]
# two small sizes, not multiples of 64: below every sum of 4096 floats, above which inductor's C++ reductions switch
# to a chunked accumulator and guard on it (at the recipe's sizes that gives a CPU three training graphs and two eval
# graphs, docs/dev/benchmarks.md)
SMALL_SIZES = [(128, 192), (160, 96)]
# inductor's compile time grows with the kernels it generates: a MALA stage and a softmax stage, one block each
TWO_STAGES = dict(arch=dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[1, 2]), attn_types=('mala', 'softmax'),
                  out_indices=(0, 1))
FP32_BOUND = 1e-4
# how much further from fp32 the compiled model under bf16 autocast may be than the eager one: rounding happens at
# other places in a compiled graph (measured: 1.00x for the outputs, 1.09x for the gradients)
AUTOCAST_ERROR_RATIO = 1.5


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Every MALA runs its blocks through one function, whose graphs dynamo keeps across models: a model of an
    earlier test with blocks alike would lend its graphs to the next, and the graphs counted would be fewer."""
    torch.compiler.reset()


def narrow_pair(compile, **kwargs):
    """An eager and a compiled model (``compile``) with the same weights; ``kwargs`` for both, NARROW unless they
    name an arch."""
    torch.manual_seed(0)
    kwargs = dict(dict(arch=NARROW, drop_path_rate=0.0), **kwargs)
    eager = MALA(**kwargs)
    eager.init_weights()
    compiled = MALA(compile=compile, **kwargs)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def relative_error(ours, expected) -> float:
    """The largest difference over the tensors relative to their largest magnitude (a gradient that is zero in
    exact arithmetic, such as a conv bias before BatchNorm, has no scale of its own): fp32's reassociation in fused
    reductions moves single elements by about 1e-5 of a unit-scale map."""
    difference = max((a - b).abs().max() for a, b in zip(ours, expected))
    return (difference / max(b.abs().max() for b in expected)).item()


def loss_and_grads(model, x):
    outputs = model(x)
    loss = sum((out * torch.linspace(-1, 1, out.shape[1])[:, None, None]).square().mean() for out in outputs)
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return [out.detach() for out in outputs], grads


def graphs_and_errors(eager, compiled, sizes):
    """The graphs the compiled model caches for a train step (forward and gradients) at each size, then for eval at
    each size, and its relative errors against the eager model's outputs and gradients (counters' graphs, not
    backend calls: dynamo's restart of the first trace, to specialise a module's float attribute, is no graph)."""
    generator = torch.Generator().manual_seed(1)
    counters.clear()
    errors = []
    for height, width in sizes:
        x = torch.randn(2, 3, height, width, generator=generator)
        outputs, grads = loss_and_grads(compiled.train(), x)
        expected_outputs, expected_grads = loss_and_grads(eager.train(), x)
        errors += [relative_error(outputs, expected_outputs), relative_error(grads, expected_grads)]
    train_graphs = counters['stats']['unique_graphs']
    with torch.no_grad():
        for height, width in sizes:
            x = torch.randn(2, 3, height, width, generator=generator)
            errors.append(relative_error(compiled.eval()(x), eager.eval()(x)))
    eval_graphs = counters['stats']['unique_graphs'] - train_graphs
    print(f'graphs: {train_graphs} for training, {eval_graphs} for eval; relative errors by size {errors}')
    return train_graphs, eval_graphs, errors


@pytest.mark.slow
def test_compiled_blocks_trace_once_per_kind_and_match_eager_across_the_recipe_sizes():
    """Dynamo and AOTAutograd's graph with eager kernels (aot_eager): the six sizes share one graph per kind of
    block for training and one for eval, nothing in the model guards on the input's size."""
    eager, compiled = narrow_pair(compile=dict(backend='aot_eager'))
    train_graphs, eval_graphs, errors = graphs_and_errors(eager, compiled, RECIPE_SIZES)
    assert (train_graphs, eval_graphs) == (NARROW_BLOCK_KINDS, NARROW_BLOCK_KINDS)
    assert max(errors) < FP32_BOUND


@pytest.mark.slow
def test_inductor_compiles_one_graph_per_kind_of_block_for_training_and_for_eval_that_match_eager():
    """The default backend, inductor, as ``compile=True`` runs it: its generated code gives eager's outputs and
    gradients, and a second size reuses each graph."""
    eager, compiled = narrow_pair(compile=True, **TWO_STAGES)
    train_graphs, eval_graphs, errors = graphs_and_errors(eager, compiled, SMALL_SIZES)
    assert (train_graphs, eval_graphs) == (2, 2)  # a MALA block and a softmax block
    assert max(errors) < FP32_BOUND


@pytest.mark.slow
def test_stochastic_depth_rates_share_the_graph_of_their_kind_of_block():
    """Each block drops with its own rate; the rates enter the compiled graph as inputs, not as constants that would
    compile a graph per block and, past dynamo's limit, run the rest eagerly. A stage's blocks share one graph, and
    the first block (rate 0, no DropPath) has one of its own."""
    torch.manual_seed(0)
    compiled = MALA(arch=dict(NARROW, depths=[3, 2, 1, 1]), drop_path_rate=0.3, compile=dict(backend='aot_eager'))
    counters.clear()
    loss_and_grads(compiled.train(), torch.randn(2, 3, 64, 96))
    assert counters['stats']['unique_graphs'] == NARROW_BLOCK_KINDS + 1


@pytest.mark.slow
def test_a_deep_copy_runs_its_own_parameters_through_the_same_graphs():
    """mmengine's EMA hook deep-copies the model and averages the copy's parameters: the copy's compiled blocks
    must read its parameters, not the graphs' first model's, and need no graphs of their own."""
    eager, compiled = narrow_pair(compile=dict(backend='aot_eager'))
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        compiled.eval()(x)
        graphs = counters['stats']['unique_graphs']
        average = copy.deepcopy(compiled)
        for parameter in average.parameters():
            parameter.mul_(0.9)
        eager.load_state_dict(average.state_dict())
        ours, expected = average(x), eager.eval()(x)
        assert relative_error(ours, expected) < FP32_BOUND
        assert relative_error(compiled(x), ours) > 1e-2  # the copy's parameters made a difference
    assert counters['stats']['unique_graphs'] == graphs


@pytest.mark.slow
def test_compiled_backbone_under_bf16_autocast_is_as_close_to_fp32_as_eager():
    """The paper configs train under autocast (fp16 on GPUs); inside a compiled graph the convolutions are cast by
    hand (autocast does not know the custom operator). Through aot_eager, which runs that graph and its gradient
    with eager kernels: inductor's C++ code for bf16 is torch's, and takes minutes to build here."""
    eager, compiled = narrow_pair(compile=dict(backend='aot_eager'))
    x = torch.randn(2, 3, 128, 192)
    fp32_outputs, fp32_grads = loss_and_grads(eager.train(), x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outputs, grads = loss_and_grads(compiled.train(), x)
        eager_outputs, eager_grads = loss_and_grads(eager.train(), x)
    for ours, theirs, fp32 in ((outputs, eager_outputs, fp32_outputs), (grads, eager_grads, fp32_grads)):
        error, eager_error = relative_error(ours, fp32), relative_error(theirs, fp32)
        print(f'relative error against fp32: compiled {error:.3g}, eager {eager_error:.3g}')
        assert eager_error > 1e-3  # the check would mean nothing if autocast did not reach the model
        assert error < AUTOCAST_ERROR_RATIO * eager_error


def test_compile_argument_is_checked():
    with pytest.raises(MALAConfigError, match='compile must be a bool or a dict'):
        MALA(arch=NARROW, compile='yes')


@pytest.mark.slow
def test_compile_arguments_replace_the_defaults():
    """``dynamic`` and ``fullgraph`` given in ``compile`` take the place of the defaults: static sizes compile one
    graph per kind of block and size of its map, so the two softmax stages' blocks, alike but for the size of their
    maps, take a graph each: four at each input size."""
    eager, compiled = narrow_pair(compile=dict(backend='aot_eager', dynamic=False))
    train_graphs, eval_graphs, errors = graphs_and_errors(eager, compiled, SMALL_SIZES)
    assert (train_graphs, eval_graphs) == (4 * len(SMALL_SIZES), 4 * len(SMALL_SIZES))
    assert max(errors) < FP32_BOUND


@NEEDS_CUSTOM_OPS
def test_tracing_for_export_sees_the_plain_model():
    """A model built with compile=True traces (TorchScript, as ONNX's older exporter does) to ATen convolutions,
    not to the compiled graph's custom operator, and to the eager model's outputs."""
    eager, compiled = narrow_pair(compile=True)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        # without jit's own check, which runs the module again outside the trace: that run is the compiled one
        traced = torch.jit.trace(compiled.eval(), x, check_trace=False)
        assert 'mala_mm::' not in str(traced.inlined_graph)
        for ours, expected in zip(traced(x), eager.eval()(x)):
            torch.testing.assert_close(ours, expected)
