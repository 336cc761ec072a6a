"""mala_tools.analysis.step_profile: every operator of a train step is charged to one part of the model,
backward too."""
import math

import torch

from mala_mm import MALA
from mala_mm.ops.mala_attention import torch_ops as attention_ops
from mala_mm.ops.rope import torch_ops as rope_ops
from mala_tools.analysis.step_profile import PREFIX, charge, labelled_parts, profile, table_rows


def test_a_train_step_is_charged_to_the_parts_that_ran_it(small_arch):
    model = MALA(arch=small_arch)
    model.train()
    apply_rope = rope_ops.apply_rope
    with labelled_parts(model):
        events = profile(model, torch.randn(1, 3, 64, 96), train=True, steps=1)
    # the labels leave nothing behind
    assert attention_ops.apply_rope is apply_rope and rope_ops.apply_rope is apply_rope
    assert not any('attend' in module.__dict__ for module in model.modules())
    assert not model._forward_hooks and not any(m._forward_pre_hooks for m in model.modules())

    parts = charge(events)
    # both attention kinds and the convs are found in the forward and, through the autograd nodes, the backward
    for part in ('attention: softmax (SDPA)', 'attention: MALA core (phi, z, beta, matmuls)',
                 'attention: RoPE rotation', 'attention: LePE dwconv 5x5 and gate', 'FFN: GELU and dwconv 3x3',
                 'FFN: 1x1 convs', 'LayerNorms', 'stem and downsamples (convs, BN)'):
        assert parts[part]['forward ms'] > 0 and parts[part]['backward ms'] > 0, part
    # every operator's own time is charged once
    own_time = sum(e.self_cpu_time_total for e in events if not e.name.startswith(PREFIX)) / 1e3
    charged = sum(times['forward ms'] + times['backward ms'] for times in parts.values())
    assert math.isclose(charged, own_time, rel_tol=1e-9)

    rows = table_rows(parts, steps=1)
    assert rows[-1]['part'] == 'all' and math.isclose(rows[-1]['total ms'], charged, rel_tol=1e-9)
    assert math.isclose(sum(row['share %'] for row in rows[:-1]), 100.0, rel_tol=1e-9)
