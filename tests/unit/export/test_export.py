"""ONNX export: the backbone with torch.onnx.export as users call it, and mala_mm.export's graphs of detectors and
its check of their detections, run in ONNX Runtime and compared with PyTorch."""
import inspect

import numpy as np
import onnxruntime
import pytest
import torch

from mala_mm import MALA
from mala_mm.export import (ExportError, ImageToTensors, check_shape, compare_detections, compare_in_onnxruntime,
                            export_onnx, pair_detections)
from mala_mm.sample_inputs import data_samples, image_metainfo
from mala_tools.model import build_model
from tests.helpers import ROOT, load_config

RETINANET_CONFIG = f'{ROOT}/configs/detection/retinanet_mala_t_builtin.py'

# fp32 arithmetic in another order (ONNX Runtime's kernels) differs by a few roundings of 2^-24 per op
RELATIVE_TOLERANCE = 1e-4
# torch.onnx.export's TorchScript exporter, as the deployment page calls it (torch 2.5 and newer choose with
# dynamo=False; before, it is the only one and takes no such argument) at its default opset
TORCHSCRIPT = dict(dynamo=False) if 'dynamo' in inspect.signature(torch.onnx.export).parameters else {}


def onnxruntime_outputs(path, image):
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    return session.run(None, {session.get_inputs()[0].name: image.numpy()})


def assert_matches(expected, produced):
    assert len(expected) == len(produced)
    for ours, theirs in zip(expected, produced):
        assert theirs.shape == tuple(ours.shape)
        error = np.abs(theirs.astype(np.float64) - ours.double().numpy()).max()
        assert error <= RELATIVE_TOLERANCE * ours.abs().max().item()


@pytest.mark.parametrize('attn_types', ['released', 'mala'])
def test_backbone_exports_with_dynamic_sizes_and_matches_in_onnxruntime(tmp_path, attn_types):
    model = MALA(arch='tiny', **({} if attn_types == 'released' else dict(attn_types='mala'))).eval()
    model.init_weights()
    path = tmp_path / 'mala.onnx'
    torch.onnx.export(model, (torch.randn(1, 3, 96, 128), ), str(path), **TORCHSCRIPT, input_names=['image'],
                      dynamic_axes={'image': {0: 'batch', 2: 'height', 3: 'width'}})
    for shape in [(1, 3, 96, 128), (2, 3, 133, 75)]:  # the export's size and one it never saw, not a multiple of 32
        image = torch.randn(*shape)
        with torch.no_grad():
            expected = model(image)
        assert_matches(expected, onnxruntime_outputs(path, image))
    # tracing computes the RoPE tables from the traced size and leaves the eager cache to eager tensors
    assert all(type(t.cos) is torch.Tensor for stage in model.layers for _, t in stage.RoPE.cached_tables())


@pytest.mark.parametrize('arch', ['tiny', 'small', pytest.param('base', marks=pytest.mark.slow),
                                  pytest.param('large', marks=pytest.mark.slow)])  # 10-20 s each to trace
def test_plain_torch_onnx_export_of_every_variant(tmp_path, arch):
    model = MALA(arch=arch).eval()
    image = torch.randn(1, 3, 64, 96)
    path = tmp_path / f'{arch}.onnx'
    torch.onnx.export(model, (image, ), str(path), **TORCHSCRIPT)
    with torch.no_grad():
        assert_matches(model(image), onnxruntime_outputs(path, image))


def test_the_library_names_its_parameters_where_the_tool_names_its_flags():
    with pytest.raises(ExportError) as raised:
        check_shape([16, 64])
    assert str(raised.value) == '`shape` needs two integers H W, each at least 32; got [16, 64]'


def test_exported_retinanet_outputs_give_the_models_detections(tmp_path):
    """What a user runs after the graph: the head's own post-processing on ONNX Runtime's outputs."""
    model = build_model(load_config(RETINANET_CONFIG))
    module = ImageToTensors(model)
    image = torch.rand(1, 3, 128, 160) * 255
    path = str(tmp_path / 'retinanet.onnx')
    export_onnx(module, image, path, exporter='torchscript')
    reference = ImageToTensors(model, exportable=False)
    assert max(row['max_rel'] for row in compare_in_onnxruntime(reference, path, image)) <= RELATIVE_TOLERANCE
    levels = len(model.bbox_head.prior_generator.strides)
    produced = [torch.from_numpy(t) for t in onnxruntime_outputs(path, image)]
    with torch.no_grad():
        from_onnx = model.bbox_head.predict_by_feat(produced[:levels], produced[levels:2 * levels],
                                                    batch_img_metas=[image_metainfo(128, 160)], rescale=False)[0]
        x = module.normalise(image)
        from_torch = model.bbox_head.predict(model.extract_feat(x), data_samples('mmdet', 128, 160),
                                             rescale=False)[0]
    assert len(from_torch.bboxes) > 0
    torch.testing.assert_close(from_onnx.bboxes, from_torch.bboxes, rtol=1e-4, atol=1e-3)
    assert torch.equal(from_onnx.labels, from_torch.labels)


def test_retinanet_exported_with_nms_gives_the_models_detections(tmp_path):
    """With --nms the graph ends in ONNX's NonMaxSuppression and returns what mmdet's predict returns, at a size
    the export never saw. An untrained head scores every anchor near its prior (0.01), so a threshold below that
    gives NMS thousands of overlapping candidates of every class to sort out."""
    import onnx
    test_cfg = dict(score_thr=0.005, nms_pre=1000, max_per_img=1000)
    cfg = load_config(RETINANET_CONFIG)
    cfg.merge_from_dict(dict(model=dict(test_cfg=test_cfg)))
    model = build_model(cfg)
    module = ImageToTensors(model, nms=True)
    path = str(tmp_path / 'retinanet_nms.onnx')
    assert export_onnx(module, torch.rand(1, 3, 128, 160) * 255, path, dynamic=True,
                       exporter='torchscript') == ['boxes', 'scores', 'labels']
    assert 'NonMaxSuppression' in {node.op_type for node in onnx.load(path).graph.node}
    image = torch.rand(1, 3, 165, 139) * 255
    with torch.no_grad():
        expected = ImageToTensors(model, nms=True, exportable=False)(image)  # mmdet's preprocessor and predict
        level_scores = model.bbox_head(model.extract_feat(module.pad(module.normalise(image))))[0]
    candidates = sum(min(test_cfg['nms_pre'], int((s.sigmoid() > test_cfg['score_thr']).sum())) for s in level_scores)
    assert 0 < len(expected[0]) < min(candidates, test_cfg['max_per_img'])  # NMS, not a cap, set the count
    pairing = pair_detections(expected, [torch.from_numpy(t) for t in onnxruntime_outputs(path, image)], 165)
    assert pairing.alone == 0  # no cap: nothing is cut off
    boxes, scores, labels = pairing.produced
    torch.testing.assert_close(boxes, expected[0], rtol=RELATIVE_TOLERANCE, atol=RELATIVE_TOLERANCE * 165)
    torch.testing.assert_close(scores, expected[1], rtol=RELATIVE_TOLERANCE, atol=0)
    assert torch.equal(labels, expected[2])


def detections(boxes, scores, labels):
    return [torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores), torch.tensor(labels)]


# an untrained head's detections, best first: scores near its prior, the last two at the cutoff of a top-k
KEPT = detections([[0, 0, 10, 10], [20, 20, 40, 40], [5, 50, 25, 70], [60, 0, 80, 30]],
                  [0.0104, 0.0102, 0.010005, 0.01], [3, 1, 3, 2])


def test_a_detection_kept_by_one_engine_at_the_cutoff_is_a_near_tie():
    """PyTorch keeps its last detection, ONNX Runtime another that scored a rounding below it in PyTorch: each
    within the score bound of its engine's cutoff, so neither counts against the export; the rest pair as usual."""
    produced = detections([[0, 0, 10, 10], [5, 50, 25, 70], [20, 20, 40, 40], [90, 90, 99, 99]],
                          [0.0104, 0.010005, 0.0102, 0.01003], [3, 3, 1, 2])
    pairing = pair_detections(KEPT, produced, 100)
    assert (pairing.alone, pairing.alone_beyond_cutoff) == (2, 0)
    for ours, theirs in zip(pairing.expected, pairing.produced):
        torch.testing.assert_close(ours, theirs)
    assert len(pairing.expected[0]) == 3


@pytest.mark.parametrize('label', [3, 0], ids=['same class', 'another class'])
def test_a_detection_kept_by_one_engine_above_the_cutoff_fails_the_check(label):
    """ONNX Runtime keeps, in place of PyTorch's third detection, one that scores above every cutoff: of the same
    class, the two pair and their boxes differ; of another, neither pairs, and ONNX Runtime's is not at its
    cutoff (PyTorch's is: alone, it would be a near-tie)."""
    produced = detections([[0, 0, 10, 10], [20, 20, 40, 40], [90, 90, 99, 99], [60, 0, 80, 30]],
                          [0.0104, 0.0102, 0.0105, 0.01], [3, 1, label, 2])
    beyond = {row['output']: row['value'] for row in compare_detections(KEPT, produced, 100) if not row['within']}
    assert beyond == ({'boxes': 0.85, 'scores': pytest.approx(0.000495)} if label == 3 else {'alone': 1})


def test_untrained_retinanet_capped_at_the_top_k_matches_within_the_bounds(tmp_path):
    """An untrained head whose scores all lie a rounding apart (its classifier's weights scaled down), capped at 50
    detections after NMS: the cutoff falls among near-ties, where the two engines may keep different detections
    (on an AVX-512 Xeon, the second image keeps two such, one in each engine; the check before near-ties counted
    them as a box 0.017 of the image off)."""
    cfg = load_config(RETINANET_CONFIG)
    cfg.merge_from_dict(dict(model=dict(test_cfg=dict(score_thr=0.005, nms_pre=1000, max_per_img=50))))
    model = build_model(cfg)
    with torch.no_grad():
        model.bbox_head.retina_cls.weight.mul_(1e-3)
    path = str(tmp_path / 'retinanet_top_k.onnx')
    export_onnx(ImageToTensors(model, nms=True), torch.rand(1, 3, 128, 160) * 255, path, dynamic=True,
                exporter='torchscript')
    reference = ImageToTensors(model, nms=True, exportable=False)
    for seed in range(4):
        image = torch.rand(1, 3, 165, 139, generator=torch.Generator().manual_seed(seed)) * 255
        rows = compare_in_onnxruntime(reference, path, image)
        assert rows[0]['shape'][0] + rows[-1]['shape'][0] >= 50  # the cap, not the threshold, set the count
        assert all(row['within'] for row in rows), rows
