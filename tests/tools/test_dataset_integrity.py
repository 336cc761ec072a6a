"""Undecodable images: found before a run by tools/check_dataset.py, or skipped during one by the pipeline step
``LoadImageOrSkip`` (a warning names each, and too many stop the run with the list)."""
import shutil

import pytest

from tests.helpers import DATA_DIR, call_tool

SEG_CONFIG = f'{DATA_DIR}/upernet_mala_narrow_64px_builtin.py'


@pytest.fixture
def workspace(builtin_workspace, tmp_path):
    """A copy of the built-in dataset that a test may damage."""
    shutil.copytree(builtin_workspace / 'data', tmp_path / 'data')
    return tmp_path


NOT_AN_IMAGE = b'\xff\xd8\xff\xe0 not really a JPEG ' * 20  # non-empty, starts like a JPEG


def corrupt(path):
    path.write_bytes(NOT_AN_IMAGE)


def test_check_dataset_lists_every_undecodable_image(workspace):
    images = workspace / 'data/builtin/images'
    bad = [images / 'training/000007.jpg', images / 'training/000123.jpg', images / 'validation/000004.jpg']
    for path in bad[:2]:
        corrupt(path)
    bad[2].write_bytes(b'')
    result = call_tool(['check_dataset.py', SEG_CONFIG, '--workers', '2'], workspace)
    assert result.returncode == 2, result.stdout + result.stderr
    assert 'error: 3 of ' in result.stderr and 'images cannot be decoded' in result.stderr
    listed = [line.strip() for line in result.stderr.splitlines() if line.startswith('  data/')]
    assert [line.split(':')[0] for line in listed] == [f'data/builtin/images/{p.parent.name}/{p.name}' for p in bad]
    assert listed[0].endswith(f'not a decodable image ({len(NOT_AN_IMAGE)} bytes)') and listed[2].endswith('empty file')
    assert "dict(type='LoadImageOrSkip', max_skipped=N)" in result.stderr and 'Traceback' not in result.stderr


def test_check_dataset_passes_a_sound_dataset(workspace):
    result = call_tool(['check_dataset.py', SEG_CONFIG], workspace)
    assert result.returncode == 0, result.stderr
    assert 'every image decodes' in result.stdout


def skip_at_most(limit):
    """Options putting LoadImageOrSkip in place of the training pipeline's first step, LoadImageFromFile."""
    return ['train_dataloader.dataset.pipeline.0.type=LoadImageOrSkip',
            f'train_dataloader.dataset.pipeline.0.max_skipped={limit}']


def train(workspace, *options):
    return call_tool(['train.py', SEG_CONFIG, '--work-dir', str(workspace / 'work'), '--cfg-options',
                     'train_cfg.max_iters=6', 'param_scheduler.0.end=2', 'param_scheduler.1.begin=2',
                      'param_scheduler.1.end=6', 'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
                      *options], workspace)


def test_training_skips_undecodable_images_with_a_warning_naming_each(workspace):
    training = sorted((workspace / 'data/builtin/images/training').glob('*.jpg'))
    for path in training[::2]:  # half of them: the first batches meet some
        corrupt(path)
    result = train(workspace, *skip_at_most(1000))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert (workspace / 'work/iter_6.pth').is_file()
    skipped = [line for line in output.splitlines() if 'skipping undecodable image' in line]
    assert skipped and all('data/builtin/images/training/' in line for line in skipped)


def test_too_many_undecodable_images_stop_the_run_with_their_list(workspace):
    for path in (workspace / 'data/builtin/images/training').glob('*.jpg'):
        corrupt(path)
    result = train(workspace, *skip_at_most(2))
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert 'error: 3 images could not be decoded, more than LoadImageOrSkip.max_skipped=2:' in result.stderr
    listed = [line for line in result.stderr.splitlines() if line.startswith('  data/builtin/images/training/')]
    assert len(listed) == 3 and all(line.endswith('bytes)') for line in listed)
    assert 'python tools/check_dataset.py' in result.stderr and 'Traceback' not in result.stderr
