"""tools/export_onnx.py on segmentors, detectors and a backbone alone: each graph run in ONNX Runtime at a size the
export never saw and compared with PyTorch, and its refusals."""
import os

import pytest

from tests.helpers import ROOT, call_tool

# the tool's default --tolerance: the largest relative difference from PyTorch that it passes
TOOL_TOLERANCE = 1e-4


def export_tool(config, out, *options, weights=('--random-weights', )):
    result = call_tool(['export_onnx.py', os.path.join(ROOT, config), *weights, '--out', str(out), *options], ROOT)
    return result, result.stdout + result.stderr


@pytest.mark.parametrize('config,shape', [
    ('configs/segmentation/upernet_mala_t_builtin.py', ('128', '128')),
    ('configs/segmentation/fpn_mala_t.py', ('96', '128')),
    ('configs/detection/retinanet_mala_t_builtin.py', ('128', '160')),
    ('configs/detection/mask_rcnn_mala_t_builtin.py', ('128', '160')),
])
def test_export_tool_matches_in_onnxruntime_at_an_unseen_size(tmp_path, config, shape):
    result, log = export_tool(config, tmp_path / 'model.onnx', '--shape', *shape, '--dynamic',
                              '--exporter', 'torchscript', '--cfg-options', 'model.backbone.init_cfg=None')
    assert result.returncode == 0, log
    unseen = f'input {int(shape[0]) + 37}x{int(shape[1]) - 21}'
    assert unseen in log and 'ONNX Runtime matches PyTorch' in log
    errors = [float(line.split('max rel ')[1]) for line in log.splitlines() if 'max rel' in line]
    assert errors and max(errors) <= TOOL_TOLERANCE


@pytest.mark.slow
def test_export_tool_with_the_dynamo_exporter(tmp_path):
    # the built-in UperNet with a narrow MALA: what the exporter traces is the same kind of graph, in fewer blocks
    result, log = export_tool('tests/data/upernet_mala_narrow_64px_builtin.py', tmp_path / 'model.onnx',
                              '--shape', '96', '96', '--dynamic')
    assert result.returncode == 0, log
    assert 'input 133x75' in log and 'ONNX Runtime matches PyTorch' in log


def test_backbone_only_export_returns_the_feature_maps(tmp_path):
    result, log = export_tool('configs/detection/mask_rcnn_mala_t_builtin.py', tmp_path / 'backbone.onnx',
                              '--backbone-only', '--shape', '64', '96', '--exporter', 'torchscript')
    assert result.returncode == 0, log
    assert [line.split()[2] for line in log.splitlines() if 'max rel' in line] == [f'stage{i}' for i in range(4)]


def test_a_config_without_mala_exports_too(tmp_path):
    config = tmp_path / 'retinanet_r18_builtin.py'
    config.write_text(
        f"_base_ = ['{ROOT}/configs/detection/retinanet_mala_t_builtin.py']\n"
        "model = dict(backbone=dict(_delete_=True, type='ResNet', depth=18, out_indices=(0, 1, 2, 3)),\n"
        "             neck=dict(in_channels=[64, 128, 256, 512]))\n")
    result = call_tool(['export_onnx.py', str(config), '--random-weights', '--out', str(tmp_path / 'r18.onnx'),
                       '--shape', '96', '96', '--exporter', 'torchscript'], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'ONNX Runtime matches PyTorch' in result.stdout


@pytest.mark.parametrize('shape', [['0', '128'], ['128'], ['16', '64']])
def test_a_wrong_shape_is_a_clear_error(tmp_path, shape):
    result, log = export_tool('configs/segmentation/upernet_mala_t_builtin.py', tmp_path / 'model.onnx',
                              '--shape', *shape, '--exporter', 'torchscript')
    assert result.returncode == 2
    assert 'error: --shape needs two integers H W, each at least 32' in result.stderr
    assert 'Traceback' not in log and not (tmp_path / 'model.onnx').exists()


def test_a_difference_beyond_the_tolerance_fails_the_tool(tmp_path):
    result, log = export_tool('configs/segmentation/upernet_mala_t_builtin.py', tmp_path / 'model.onnx',
                              '--shape', '64', '64', '--exporter', 'torchscript', '--tolerance', '0')
    assert result.returncode == 2
    assert 'error: ONNX Runtime differs from PyTorch by' in result.stderr and 'more than --tolerance 0' in log


def test_a_detector_that_finds_nothing_exports_and_finds_nothing_in_onnxruntime(tmp_path):
    """No detection at all (every score below the threshold): the graph still runs, and gives empty outputs of
    the right shapes, as mmdet does."""
    result, log = export_tool('configs/detection/mask_rcnn_mala_t_builtin.py', tmp_path / 'model.onnx', '--shape',
                              '64', '96', '--dynamic', '--nms', '--exporter', 'torchscript', '--cfg-options',
                              'model.test_cfg.rcnn.score_thr=1.0')
    assert result.returncode == 0, log
    assert 'input 101x75  masks   (0, 101, 75)' in log
    assert 'match mmdet\'s predict within the bounds; neither found anything: --image checks on a picture' in log


@pytest.mark.parametrize('config,options,message', [
    ('configs/segmentation/upernet_mala_t_builtin.py', ['--exporter', 'torchscript'],
     '--nms applies to detectors, not to a segmentor'),
    ('configs/detection/retinanet_mala_t_builtin.py', ['--exporter', 'dynamo'],
     '--nms exports the detections of one image with the TorchScript exporter: pass --exporter torchscript'),
    ('configs/detection/mask_rcnn_mala_t_builtin.py', ['--exporter', 'torchscript', '--opset', '15'],
     "a two-stage detector's detections need ONNX's RoiAlign of opset 16 or later (mmcv's aligned sampling); "
     'got --opset 15'),
    ('configs/detection/mask_rcnn_mala_t_builtin.py',
     ['--exporter', 'torchscript', '--cfg-options', 'model.test_cfg.rcnn.nms.type=soft_nms'],
     "StandardRoIHead test_cfg.nms is {'type': 'soft_nms', 'iou_threshold': 0.5}; the export has plain per-class "
     'nms only'),
])
def test_nms_where_it_cannot_apply_is_a_clear_error(tmp_path, config, options, message):
    result, log = export_tool(config, tmp_path / 'model.onnx', '--nms', '--shape', '64', '64', *options)
    assert result.returncode == 2 and f'error: {message}' in result.stderr
    assert 'Traceback' not in log and not (tmp_path / 'model.onnx').exists()


@pytest.mark.parametrize('weights, message', [
    ((), 'error: no CHECKPOINT: name the trained weights, or pass --random-weights'),
    (('model.pth', '--random-weights'), 'error: CHECKPOINT model.pth and --random-weights: give one of the two')])
def test_the_weights_are_named_or_explicitly_random(tmp_path, weights, message):
    result, log = export_tool('configs/segmentation/upernet_mala_t_builtin.py', tmp_path / 'model.onnx',
                              '--exporter', 'torchscript', weights=weights)
    assert result.returncode == 2 and message in result.stderr, log
    assert not (tmp_path / 'model.onnx').exists()


def test_a_slide_mode_segmentor_is_refused_with_what_to_set(tmp_path):
    """mmseg's test of a slide-mode segmentor runs windows; a whole-image graph checked against whole-image
    inference would 'match' while differing from the test's results."""
    slide = "model.test_cfg.mode=slide model.test_cfg.crop_size=(64,64) model.test_cfg.stride=(48,48)".split()
    result, log = export_tool('configs/segmentation/upernet_mala_t_builtin.py', tmp_path / 'model.onnx',
                              '--shape', '64', '64', '--exporter', 'torchscript', '--cfg-options', *slide)
    assert result.returncode == 2, log
    assert "model.test_cfg.mode='slide'" in result.stderr and '--cfg-options model.test_cfg.mode=whole' in log
    assert not (tmp_path / 'model.onnx').exists()
