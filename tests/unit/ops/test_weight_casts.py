"""mala_mm.ops.weight_casts: the backbone's own copies of its convolutions' weights under autocast are autocast's,
value for value and gradient for gradient, made in one launch a group in training and one in all in eval."""
import torch

from mala_mm import MALA
from mala_mm.ops import weight_casts


def _autocast():
    return torch.autocast('cpu', dtype=torch.bfloat16)


def _outputs_and_gradients(model, x, monkeypatch, own_copies: bool):
    if not own_copies:  # every convolution left to autocast's own casts
        monkeypatch.setattr(model.runtime, 'weight_copies', False)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same stochastic depth in both runs
    with _autocast():
        outs = model(x)
    sum((out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() for out in outs).backward()
    monkeypatch.undo()
    return outs, {name: p.grad for name, p in model.named_parameters()}


def test_training_under_autocast_gives_autocasts_values_and_gradients(small_arch, monkeypatch):
    model = MALA(arch=small_arch, frozen_stages=1)
    model.init_weights()
    model.train()
    x = torch.randn(2, 3, 48, 64)
    outs, grads = _outputs_and_gradients(model, x, monkeypatch, own_copies=True)
    expected_outs, expected_grads = _outputs_and_gradients(model, x, monkeypatch, own_copies=False)
    assert all(torch.equal(out, expected) for out, expected in zip(outs, expected_outs))
    # frozen parameters (the stem, the first stage and its output norm) get none, as under autocast's casts
    frozen = ('patch_embed', 'layers.0.', 'extra_norms.0.')
    for name, grad in grads.items():
        expected = expected_grads[name]
        assert (grad is None) == (expected is None) == name.startswith(frozen), name
        if grad is not None:
            assert grad.dtype == torch.float32 and grad.stride() == expected.stride(), name
            assert torch.equal(grad, expected), name


def _count_copies(monkeypatch, run: bool = True) -> list:
    """The number of tensors of each multi-tensor copy made from now on (copied, or not where ``run`` is False)."""
    copies, foreach_copy = [], weight_casts.foreach_copy_

    def counted(out, src):
        copies.append(len(out))
        if run:
            foreach_copy(out, src)
    monkeypatch.setattr(weight_casts, 'foreach_copy_', counted)
    return copies


def test_training_copies_each_stage_in_one_launch_forward_and_backward(small_arch, monkeypatch):
    copies = _count_copies(monkeypatch)
    model = MALA(arch=small_arch)
    model.train()
    with _autocast():
        outs = model(torch.randn(2, 3, 64, 64))
    convs = [sum(isinstance(m, torch.nn.Conv2d) for m in part.modules()) for part in (model.patch_embed, *model.layers)]
    assert copies == [2 * n for n in convs]  # weight and bias of each conv, a stage a copy
    sum(out.float().sum() for out in outs).backward()
    assert copies[len(convs):] == list(reversed([2 * n for n in convs]))  # the gradients, a stage a copy


def test_eval_copies_every_weight_in_one_launch_a_forward_and_sees_changes_through_data(small_arch, monkeypatch):
    copies = _count_copies(monkeypatch)
    model = MALA(arch=small_arch).eval()
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        with _autocast():
            first = model(x)
        assert copies == [sum(2 * isinstance(m, torch.nn.Conv2d) for m in model.modules())]
        # as mmengine's EMA hook swaps weights in: through .data, which no version counter records
        model.layers[1].blocks[0].ffn.fc1.weight.data.mul_(2)
        with _autocast():
            changed = model(x)
        assert len(copies) == 2
        monkeypatch.setattr(model.runtime, 'weight_copies', False)
        with _autocast():
            expected = model(x)
    assert all(torch.equal(a, b) for a, b in zip(changed, expected))
    assert not torch.equal(changed[1], first[1])


def test_without_autocast_or_with_checkpointing_nothing_is_copied(small_arch, monkeypatch):
    copies = _count_copies(monkeypatch, run=False)
    x = torch.randn(2, 3, 64, 64)
    MALA(arch=small_arch).train()(x)
    with _autocast():  # recomputation in the backward would not see the copies
        MALA(arch=small_arch, with_cp=True).train()(x.requires_grad_())
    assert copies == []


def test_a_region_without_autocast_reads_the_parameters_and_makes_no_copy(monkeypatch):
    copies = _count_copies(monkeypatch)
    conv = torch.nn.Conv2d(3, 4, 1)
    with _autocast(), weight_casts.low_precision_weights([[conv.weight, conv.bias]], torch.bfloat16):
        with torch.autocast('cpu', enabled=False):
            assert weight_casts.low_precision(conv.weight) is conv.weight
        assert copies == []
        assert weight_casts.low_precision(conv.weight).dtype == torch.bfloat16
    assert copies == [2]
