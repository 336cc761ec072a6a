"""The tools: bad input stops them, and the launchers, with one clear line and exit status 2 before any work
starts; a model built from a config runs, and the benchmark and the demo report on it."""
import os
import os.path as osp
from pathlib import Path

import pytest
import torch

from mala_tools.errors import ToolError
from mala_tools.model import build_model
from tests.helpers import HELPERS_DIR, ROOT, call_tool, load_config, run_tool
from tests.helpers.hostile_pickles import WritesAFile

DET_CONFIG = osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py')
SEG_CONFIG = osp.join(ROOT, 'configs/segmentation/upernet_mala_t_builtin.py')


@pytest.mark.parametrize('tool', ['train.py', 'dist_train.sh'])
def test_wrong_config_path(tool, tmp_path):
    args = [tool, 'configs/detection/no_such_config.py'] + (['2'] if tool.endswith('.sh') else [])
    result = run_tool(args, cwd=tmp_path)
    assert result.returncode == 2
    assert "config file 'configs/detection/no_such_config.py' does not exist" in result.stderr


@pytest.mark.parametrize('config', [DET_CONFIG, SEG_CONFIG])
def test_missing_dataset_names_the_folder_and_the_command(config, tmp_path):
    # run from an empty folder: the configs' data/builtin/ is relative to the working directory
    result = call_tool(['train.py', config], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "dataset not found under 'data/builtin/'" in result.stderr
    assert 'data/builtin/images/training' in result.stderr
    assert 'python tools/make_builtin_dataset.py --out data/builtin' in result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.slow  # two processes through torchrun
@pytest.mark.parametrize('slow_rank', ['0', '1'])
def test_missing_dataset_through_the_launcher(tmp_path, slow_rank):
    """One process checks the dataset and the job stops with its message printed once, whichever process is
    scheduled last: torchrun stops the others as soon as one exits, so a process that printed only after
    another had exited would lose the line."""
    result = run_tool(['dist_train.sh', DET_CONFIG, '2'], cwd=tmp_path, MALA_MM_SLOW_RANK=slow_rank,
                      PYTHONPATH=osp.join(HELPERS_DIR, 'slow_rank'))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count('python tools/make_builtin_dataset.py --out data/builtin') == 1, output[-3000:]


def test_missing_pretrained_weights_are_named_before_training(tmp_path):
    # a paper config in a folder without checkpoints/: the weights are named along with the missing COCO data
    result = call_tool(['train.py', osp.join(ROOT, 'configs/detection/mask_rcnn_mala_s.py')], cwd=tmp_path)
    assert result.returncode == 2
    assert ("model.backbone.init_cfg.checkpoint 'checkpoints/mala_s_in1k.pth' does not exist; the ImageNet "
            "weights and where they go: docs/get_started.md#weights") in result.stderr
    assert "dataset not found under 'data/coco/'" in result.stderr
    assert 'Traceback' not in result.stderr


def test_cfg_options_that_cannot_merge_are_one_line(tmp_path):
    result = call_tool(['train.py', DET_CONFIG, '--cfg-options', 'model.backbone.init_cfg.type=Pretrained'],
                       cwd=tmp_path)
    assert result.returncode == 2
    assert 'error: --cfg-options: init_cfg=' in result.stderr and 'Traceback' not in result.stderr


def test_other_datasets_get_a_generic_hint(tmp_path):
    result = call_tool(['train.py', SEG_CONFIG, '--cfg-options',
                       'train_dataloader.dataset.data_root=data/ade/', 'val_dataloader.dataset.data_root=data/ade/'],
                       cwd=tmp_path)
    assert result.returncode == 2
    assert "dataset not found under 'data/ade/'" in result.stderr
    assert 'dataset guides' in result.stderr and 'make_builtin_dataset' not in result.stderr


@pytest.mark.parametrize('tool', ['dist_train.sh', 'dist_test.sh'])
def test_more_processes_than_the_machine_has(tool, tmp_path):
    too_many = str(len(os.sched_getaffinity(0)) + 1)  # no CUDA here: the limit is the CPU cores
    args = [tool, DET_CONFIG] + ([DET_CONFIG] if tool == 'dist_test.sh' else []) + [too_many]
    result = run_tool(args, cwd=tmp_path)
    assert result.returncode == 2
    assert f'asked for {too_many} processes, but this machine has' in result.stderr
    assert 'pass GPUS <=' in result.stderr


def test_zero_processes(tmp_path):
    result = run_tool(['dist_train.sh', DET_CONFIG, '0'], cwd=tmp_path)
    assert result.returncode == 2
    assert "GPUS must be a positive number of processes, got '0'" in result.stderr


def test_missing_checkpoints(tmp_path):
    result = call_tool(['test.py', SEG_CONFIG, 'no_such.pth'], cwd=tmp_path)
    assert result.returncode == 2
    assert "checkpoint 'no_such.pth' does not exist" in result.stderr
    result = call_tool(['train.py', SEG_CONFIG, '--resume', 'no_such.pth'], cwd=tmp_path)
    assert result.returncode == 2
    assert "--resume checkpoint 'no_such.pth' does not exist" in result.stderr


def test_benchmark_reports_speed(tmp_path):
    result = call_tool(['benchmark.py', SEG_CONFIG, '--shape', '64', '64', '--warmup', '1',
                       '--iters', '2'], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'upernet_mala_t_builtin.py' in result.stdout and 'images/s' in result.stdout


def truncated_checkpoint(folder) -> str:
    whole = folder / 'whole.pth'
    torch.save({'state_dict': {f'w{i}': torch.zeros(1000) for i in range(10)}}, whole)
    truncated = folder / 'truncated.pth'
    truncated.write_bytes(whole.read_bytes()[:20_000])
    return str(truncated)


def test_benchmark_explains_a_checkpoint_it_cannot_load(tmp_path):
    result = call_tool(['benchmark.py', SEG_CONFIG, '--checkpoint', truncated_checkpoint(tmp_path), '--shape', '64',
                       '64', '--warmup', '1', '--iters', '1'], cwd=tmp_path)
    assert result.returncode == 2
    assert 'it is truncated or corrupted' in result.stderr and 'Traceback' not in result.stderr


def build_model_error(cfg, checkpoint=None) -> str:
    """The message with which ``build_model`` refused (a ToolError, which the tools print as their error line)."""
    with pytest.raises(ToolError) as refused:
        build_model(cfg, checkpoint)
    return str(refused.value)


@pytest.mark.parametrize('option, message', [
    ({'default_scope': 'mmpretrain'}, f"{DET_CONFIG}: default_scope is 'mmpretrain'; these tools run configs "
                                      "whose default_scope is one of ('mmdet', 'mmseg')"),
    ({'model.backbone.frozen_stage': 1}, f"{DET_CONFIG}: model.backbone: MALA has no argument 'frozen_stage'; "
                                         "did you mean 'frozen_stages'?"),
    ({'model.neck.type': 'FPNN'}, 'FPNN is not in the mmdet::model registry.'),
    ({'model.backbone.arch': 'huge'}, "MALA: unknown arch 'huge'; choose one of"),
], ids=['scope', 'misspelt key', 'unknown type', 'MALA argument'])
def test_a_config_that_cannot_build_a_model_stops_with_one_line(option, message):
    cfg = load_config(DET_CONFIG)
    cfg.merge_from_dict(option)
    error = build_model_error(cfg)
    assert error.startswith(message) and '\n' not in error


def test_a_checkpoint_that_cannot_be_loaded_stops_with_one_line(tmp_path):
    cfg = load_config(SEG_CONFIG)
    missing = str(tmp_path / 'missing.pth')
    assert build_model_error(cfg, missing) == f'checkpoint {missing!r} does not exist'
    error = build_model_error(cfg, truncated_checkpoint(tmp_path))
    assert 'it is truncated or corrupted' in error and '\n' not in error


def test_built_model_runs_without_pretrained_weights_and_knows_its_classes(tmp_path):
    # a paper config whose ImageNet weights are not here: the model is built without them, the config kept as is
    cfg = load_config(osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t.py'))
    model = build_model(cfg)
    assert cfg.model.backbone.init_cfg.type == 'Pretrained' and model.cfg.model.backbone.init_cfg is None
    assert not model.training and type(model.backbone).__name__ == 'MALA'
    assert len(model.dataset_meta['classes']) == 80 and 'palette' in model.dataset_meta  # the test dataset's

    # the classes a checkpoint's weights were trained on come first; what its meta lacks comes from the config
    checkpoint = tmp_path / 'meta_only.pth'
    torch.save({'state_dict': {}, 'meta': {'dataset_meta': {'CLASSES': ('disc', 'box')}}}, checkpoint)
    model = build_model(load_config(SEG_CONFIG), str(checkpoint))
    assert model.dataset_meta['classes'] == ('disc', 'box') and len(model.dataset_meta['palette']) == 5


def test_demo_names_the_classes_of_the_checkpoint(tmp_path):
    import cv2
    image = tmp_path / 'image.png'
    cv2.imwrite(str(image), torch.randint(0, 256, (48, 64, 3), dtype=torch.uint8).numpy())
    classes = ('sky', 'disc', 'box', 'tri', 'star')
    checkpoint = tmp_path / 'meta_only.pth'
    torch.save({'state_dict': {}, 'meta': {'dataset_meta': {'classes': classes}}}, checkpoint)
    result = call_tool(['demo.py', str(image), SEG_CONFIG, str(checkpoint), '--out', str(tmp_path / 'out.png'),
                       '--device', 'cpu'], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    present = result.stdout.split('classes present: ')[1].strip().split(', ')
    assert present and set(present) <= set(classes)
    assert cv2.imread(str(tmp_path / 'out.png')).shape == (48, 64, 3)


def test_auto_scale_lr_needs_a_base_batch_size(tmp_path):
    result = call_tool(['train.py', DET_CONFIG, '--auto-scale-lr'], cwd=tmp_path)
    assert result.returncode == 2
    assert 'has no auto_scale_lr.base_batch_size' in result.stderr


@pytest.mark.parametrize('entry', ['test.py CHECKPOINT', 'train.py --resume', 'load_from', 'init_cfg'])
def test_a_checkpoint_that_would_run_code_is_refused_on_every_path(builtin_workspace, tmp_path, entry):
    marker = tmp_path / 'pwned'
    hostile = tmp_path / 'hostile.pth'
    torch.save({'state_dict': {}, 'payload': WritesAFile(str(marker))}, hostile)
    args = {
        'test.py CHECKPOINT': ['test.py', SEG_CONFIG, str(hostile)],
        'train.py --resume': ['train.py', SEG_CONFIG, '--resume', str(hostile)],
        'load_from': ['train.py', SEG_CONFIG, '--cfg-options', f'load_from={hostile}'],
        'init_cfg': ['train.py', SEG_CONFIG, '--cfg-options', 'model.backbone.init_cfg._delete_=True',
                     'model.backbone.init_cfg.type=Pretrained',
                     f'model.backbone.init_cfg.checkpoint={hostile}'],
    }[entry]
    result = call_tool([*args, '--work-dir', str(tmp_path / 'work')],
                       cwd=builtin_workspace)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: refused to load '{hostile}'" in result.stderr and 'Traceback' not in result.stderr
    assert not marker.exists()


def test_a_truncated_checkpoint_is_explained(builtin_workspace, tmp_path):
    result = call_tool(['test.py', SEG_CONFIG, truncated_checkpoint(tmp_path), '--work-dir', str(tmp_path / 'work')],
                       cwd=builtin_workspace)
    assert result.returncode == 2, result.stderr[-3000:]
    assert 'it is truncated or corrupted' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.parametrize('option, message', [
    ('model.backbone.arch=huge', "error: MALA: unknown arch 'huge'; choose one of"),
    ('model.backbone.frozen_stages=9', 'error: MALA: frozen_stages must be in [-1, 4], got 9'),
])
def test_backbone_arguments_that_cannot_build_a_mala_are_one_line(builtin_workspace, tmp_path, option, message):
    result = call_tool(['train.py', SEG_CONFIG, '--work-dir', str(tmp_path / 'work'), '--cfg-options', option],
                       cwd=builtin_workspace)
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr and 'Traceback' not in result.stderr


def test_no_function_of_the_package_exits_the_process():
    """The package raises; only tool_main, the tools' entry, turns an error into an exit status."""
    import ast
    exits = []
    for path in sorted(Path(ROOT, 'mala_mm').rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name != 'tool_main':
                exits += [f'{path.relative_to(ROOT)}:{inner.lineno} in {node.name}' for inner in ast.walk(node)
                          if isinstance(inner, ast.Name) and inner.id in ('SystemExit', 'exit')
                          or isinstance(inner, ast.Attribute) and inner.attr == 'exit']
    assert exits == []
