"""The model zoo: one metafile entry per paper config and back, entries agreeing with their configs, and the
README's tables being what tools/gen_model_zoo.py renders from the metafiles."""
import shutil
from pathlib import Path

import pytest
from mmengine.config import Config

from conftest import import_tool, run_tool

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {'tiny': 'MALA-T', 'small': 'MALA-S', 'base': 'MALA-B', 'large': 'MALA-L'}
DATASETS = {'mmdet': 'COCO', 'mmseg': 'ADE20K'}


gen_model_zoo = import_tool('gen_model_zoo.py')
ENTRIES = [model for metafile in gen_model_zoo.load_metafiles(REPO / 'model-index.yml')
           for model in metafile['Models']]


def paper_configs():
    """Every config of a paper row. The ``*builtin*`` configs train on the built-in dataset to check the
    pipeline; they are no row of the paper, so the zoo leaves them out."""
    return sorted(str(path.relative_to(REPO)) for task in ('detection', 'segmentation')
                  for path in (REPO / 'configs' / task).glob('*.py') if 'builtin' not in path.name)


def run_gen_model_zoo(*args):
    return run_tool(['gen_model_zoo.py', *map(str, args)], REPO)


def test_every_config_has_one_entry_and_every_entry_a_config():
    configs = [entry['Config'] for entry in ENTRIES]
    assert len(configs) == len(set(configs)), 'a config has two entries'
    assert sorted(configs) == paper_configs()
    for entry in ENTRIES:
        assert entry['Name'] == Path(entry['Config']).stem


@pytest.mark.parametrize('entry', ENTRIES, ids=lambda entry: entry['Name'])
def test_entry_agrees_with_its_config(entry):
    cfg = Config.fromfile(str(REPO / entry['Config']))
    meta = entry['Metadata']
    backbone = cfg.model.backbone
    assert meta['Backbone'] == VARIANTS[backbone.arch]
    assert meta['Pretrained'] == cfg.pretrained == backbone.init_cfg.checkpoint
    assert meta['Batch Size'] == 8 * cfg.train_dataloader.batch_size  # the recipes' 8 GPUs
    if 'max_epochs' in cfg.train_cfg:
        assert meta['Epochs'] == cfg.train_cfg.max_epochs
    else:
        assert meta['Iterations'] == cfg.train_cfg.max_iters
    assert {result['Dataset'] for result in entry['Results']} == {DATASETS[cfg.default_scope]}
    for result in entry['Results']:
        for name, value in result['Metrics'].items():
            assert value is None or 0 < value < 100, f'{name}: {value}'


def params_case(entry):
    big = entry['Metadata']['Backbone'] in ('MALA-B', 'MALA-L')  # seconds to build each
    return pytest.param(entry, marks=pytest.mark.slow if big else (), id=entry['Name'])


@pytest.mark.parametrize('entry', [params_case(entry) for entry in ENTRIES])
def test_entry_params_are_the_models(entry):
    get_flops = import_tool('get_flops.py')
    _, model = get_flops.build_model(Config.fromfile(str(REPO / entry['Config'])))
    params = sum(p.numel() for p in model.parameters())
    assert entry['Metadata']['Parameters (M)'] == round(params / 1e6, 2)


def test_readme_tables_are_generated_from_the_metafiles():
    result = run_gen_model_zoo('--check')
    assert result.returncode == 0, result.stderr + result.stdout


def test_check_fails_on_a_stale_readme_and_regenerating_fixes_it(tmp_path):
    readme = tmp_path / 'README.md'
    shutil.copy(REPO / 'README.md', readme)
    text = readme.read_text()
    row = next(line for line in text.splitlines() if line.startswith('| [upernet_mala_l]'))
    readme.write_text(text.replace(row, row.replace('| 53.6 |', '| 53.7 |')))

    result = run_gen_model_zoo('--check', '--readme', readme)
    assert result.returncode == 2
    assert 'model-zoo tables differ' in result.stderr

    assert run_gen_model_zoo('--readme', readme).returncode == 0
    assert readme.read_text() == text
    assert run_gen_model_zoo('--check', '--readme', readme).returncode == 0


def test_readme_without_markers_is_refused(tmp_path):
    readme = tmp_path / 'README.md'
    readme.write_text('# a README without the model-zoo markers\n')
    result = run_gen_model_zoo('--readme', readme)
    assert result.returncode != 0
    assert '<!-- model-zoo:start -->' in result.stderr and 'Traceback' not in result.stderr
    assert readme.read_text() == '# a README without the model-zoo markers\n'
