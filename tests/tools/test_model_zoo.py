"""The model zoo: one metafile entry per paper config and back, entries agreeing with their configs, each
carrying the paper's result as its target apart from what this project measured, and the README's tables being
what tools/gen_model_zoo.py renders from the metafiles, and its variant table what it renders from MALA.arch_zoo."""
import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from mala_mm import MALA
from mala_tools import model_zoo
from tests.helpers import ROOT, call_tool, load_config

REPO = Path(ROOT)
VARIANTS = {'tiny': 'MALA-T', 'small': 'MALA-S', 'base': 'MALA-B', 'large': 'MALA-L'}
DATASETS = {'mmdet': 'COCO', 'mmseg': 'ADE20K'}


# The paper's result of every row: COCO val box / mask AP (RetinaNet: box AP), ADE20K val single-scale mIoU.
# Written out here rather than read from the metafiles, so that a changed metafile value fails. `paper`: stated in
# the paper's own text; `secondary`: the heedless-backbones `MAViT` entry.
PAPER_TARGETS = {
    'mask_rcnn_mala_t': ('secondary', {'box AP': 47.6, 'mask AP': 42.9}),
    'mask_rcnn_mala_s': ('secondary', {'box AP': 50.2, 'mask AP': 44.7}),
    'mask_rcnn_mala_b': ('secondary', {'box AP': 51.7, 'mask AP': 46.1}),
    'mask_rcnn_mala_l': ('secondary', {'box AP': 52.5, 'mask AP': 46.5}),
    'mask_rcnn_mala_s_3x': ('secondary', {'box AP': 51.4, 'mask AP': 45.5}),
    'mask_rcnn_mala_b_3x': ('secondary', {'box AP': 53.2, 'mask AP': 47.0}),
    'mask_rcnn_mala_l_3x': ('secondary', {'box AP': 53.6, 'mask AP': 47.2}),
    'cascade_mask_rcnn_mala_s_3x': ('secondary', {'box AP': 54.2, 'mask AP': 47.0}),
    'cascade_mask_rcnn_mala_b_3x': ('paper', {'box AP': 55.5, 'mask AP': 48.0}),
    'cascade_mask_rcnn_mala_l_3x': ('secondary', {'box AP': 56.0, 'mask AP': 48.4}),
    'retinanet_mala_t': ('secondary', {'box AP': 45.6}),
    'retinanet_mala_s': ('secondary', {'box AP': 48.3}),
    'retinanet_mala_b': ('secondary', {'box AP': 49.9}),
    'retinanet_mala_l': ('secondary', {'box AP': 50.6}),
    'fpn_mala_t': ('secondary', {'mIoU': 47.6}),
    'fpn_mala_s': ('secondary', {'mIoU': 50.7}),
    'fpn_mala_b': ('secondary', {'mIoU': 51.5}),
    'fpn_mala_l': ('secondary', {'mIoU': 52.8}),
    'upernet_mala_t': ('secondary', {'mIoU': 48.4}),
    'upernet_mala_s': ('secondary', {'mIoU': 51.0}),
    'upernet_mala_b': ('secondary', {'mIoU': 52.8}),
    'upernet_mala_l': ('paper', {'mIoU': 53.6}),
}
PAPER_TEXT_MARK = '†'

METAFILES = model_zoo.load_metafiles(REPO / 'model-index.yml')
ENTRIES = [model for metafile in METAFILES for model in metafile['Models']]
ENTRIES_BY_NAME = {entry['Name']: entry for entry in ENTRIES}


def measured_metrics(entry):
    return {name: value for result in entry['Results'] for name, value in result['Metrics'].items()}


def readme_rows(readme: str):
    """The rows of the README's model-zoo tables, keyed by config name, each a mapping of column to cell."""
    section = readme.split(model_zoo.START)[1].split(model_zoo.END)[0]
    rows, header = {}, None
    for line in section.splitlines():
        if not line.startswith('|'):
            header = None  # a table ended
            continue
        cells = [cell.strip() for cell in line[1:-1].split('|')]
        if header is None:
            header = cells
        elif not set(line) <= set('|-'):
            rows[re.match(r'\[(\w+)\]', cells[0]).group(1)] = dict(zip(header, cells))
    return rows


def paper_configs():
    """Every config of a paper row. The ``*builtin*`` configs train on the built-in dataset to check the
    pipeline; they are no row of the paper, so the zoo leaves them out."""
    return sorted(str(path.relative_to(REPO)) for task in ('detection', 'segmentation')
                  for path in (REPO / 'configs' / task).glob('*.py') if 'builtin' not in path.name)


def run_gen_model_zoo(*args):
    return call_tool(['gen_model_zoo.py', *map(str, args)], REPO)


def test_every_config_has_one_entry_and_every_entry_a_config():
    configs = [entry['Config'] for entry in ENTRIES]
    assert len(configs) == len(set(configs)), 'a config has two entries'
    assert sorted(configs) == paper_configs()
    for entry in ENTRIES:
        assert entry['Name'] == Path(entry['Config']).stem


@pytest.mark.parametrize('entry', ENTRIES, ids=lambda entry: entry['Name'])
def test_entry_agrees_with_its_config(entry):
    cfg = load_config(REPO / entry['Config'])
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
    for name, value in [*measured_metrics(entry).items(), *entry['Paper Results']['Metrics'].items()]:
        assert value is None or 0 < value < 100, f'{name}: {value}'


def test_the_paper_has_22_rows_and_each_is_an_entry():
    assert len(PAPER_TARGETS) == 22
    assert sorted(ENTRIES_BY_NAME) == sorted(PAPER_TARGETS)


@pytest.mark.parametrize('name', PAPER_TARGETS)
def test_entry_carries_the_papers_result_as_its_target(name):
    source, metrics = PAPER_TARGETS[name]
    assert ENTRIES_BY_NAME[name]['Paper Results'] == {'Source': source, 'Metrics': metrics}


@pytest.mark.parametrize('entry', ENTRIES, ids=lambda entry: entry['Name'])
def test_measured_metrics_are_kept_apart_from_the_target(entry):
    measured = measured_metrics(entry)
    # every target has its own slot for the measured value, under the same metric name
    assert set(measured) == set(entry['Paper Results']['Metrics'])
    # a measured value comes with the checkpoint it was measured on; a target copied into Results has none
    if any(value is not None for value in measured.values()):
        assert entry.get('Weights'), f'{entry["Name"]}: measured {measured} without the weights that gave it'


def test_readme_shows_each_target_and_measured_metric_in_its_own_column():
    rows = readme_rows((REPO / 'README.md').read_text())
    assert sorted(rows) == sorted(PAPER_TARGETS)
    for name, (source, metrics) in PAPER_TARGETS.items():
        mark = PAPER_TEXT_MARK if source == 'paper' else ''
        measured = measured_metrics(ENTRIES_BY_NAME[name])
        for metric, value in metrics.items():
            assert rows[name][f'paper {metric}'] == f'{value:.1f}{mark}', name
            expected = '' if measured[metric] is None else f'{measured[metric]:.1f}'
            assert rows[name][f'measured {metric}'] == expected, name


def test_measured_and_paper_values_render_apart():
    metafile = copy.deepcopy(next(m for m in METAFILES if any(e['Name'] == 'upernet_mala_l' for e in m['Models'])))
    entry = next(e for e in metafile['Models'] if e['Name'] == 'upernet_mala_l')
    entry['Results'][0]['Metrics']['mIoU'] = 52.1
    entry['Weights'] = 'https://example.org/upernet_mala_l.pth'
    rows = readme_rows(f'{model_zoo.START}\n{model_zoo.render_table(metafile)}\n{model_zoo.END}')
    assert rows['upernet_mala_l']['paper mIoU'] == '53.6' + PAPER_TEXT_MARK
    assert rows['upernet_mala_l']['measured mIoU'] == '52.1'
    assert rows['upernet_mala_t']['paper mIoU'] == '48.4'
    assert rows['upernet_mala_t']['measured mIoU'] == ''


def test_readme_note_names_where_the_targets_come_from():
    readme = (REPO / 'README.md').read_text()
    section = readme.split(model_zoo.START)[1].split(model_zoo.END)[0]
    note = ' '.join(line for line in section.splitlines() if line and not line.startswith(('|', '**')))
    assert f"{PAPER_TEXT_MARK} from the paper's text" in note
    for words in ('`MAViT` entry', 'heedless-backbones', 'language model', 'checked against its text',
                  "not yet checked here against the paper's PDF", 'empty until the row is trained'):
        assert words in note, words


def test_readme_tables_are_generated_from_the_metafiles():
    result = run_gen_model_zoo('--check')
    assert result.returncode == 0, result.stderr + result.stdout


def test_check_fails_on_a_stale_readme_and_regenerating_fixes_it(tmp_path):
    readme = tmp_path / 'README.md'
    shutil.copy(REPO / 'README.md', readme)
    text = readme.read_text()
    row = next(line for line in text.splitlines() if line.startswith('| [upernet_mala_l]'))
    assert '| 53.6† |' in row
    readme.write_text(text.replace(row, row.replace('| 53.6† |', '| 53.7† |')))

    result = run_gen_model_zoo('--check', '--readme', readme)
    assert result.returncode == 2
    assert 'out of date: the model-zoo tables (from the metafiles); run' in result.stderr

    assert run_gen_model_zoo('--readme', readme).returncode == 0
    assert readme.read_text() == text
    assert run_gen_model_zoo('--check', '--readme', readme).returncode == 0


def test_readme_variant_table_is_the_arch_zoo_with_each_backbone_built():
    readme = (REPO / 'README.md').read_text()
    section = readme.split(model_zoo.VARIANTS_START)[1].split(model_zoo.VARIANTS_END)[0].strip('\n')
    assert section == model_zoo.render_variant_table()
    rows = [[cell.strip() for cell in line[1:-1].split('|')] for line in section.splitlines()[2:]]
    assert [row[0] for row in rows] == ['tiny', 'small', 'base', 'large']  # the one-letter aliases left out
    tiny = MALA('tiny')
    assert rows[0] == ['tiny', '64, 128, 256, 512', '2, 2, 6, 2', '1, 2, 4, 8', '0.1',
                       f'{sum(p.numel() for p in tiny.parameters()):,}']


def test_check_fails_on_a_stale_variant_table(tmp_path):
    readme = tmp_path / 'README.md'
    text = (REPO / 'README.md').read_text()
    row = next(line for line in text.splitlines() if line.startswith('| small |'))
    readme.write_text(text.replace(row, row.replace('| 0.15 |', '| 0.2 |')))

    result = run_gen_model_zoo('--check', '--readme', readme)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert errors == [f'error: {readme}: out of date: the variant table (from MALA.arch_zoo); run python '
                      'tools/gen_model_zoo.py']
    assert run_gen_model_zoo('--readme', readme).returncode == 0
    assert readme.read_text() == text


def test_readme_without_markers_is_refused(tmp_path):
    readme = tmp_path / 'README.md'
    readme.write_text('# a README without the model-zoo markers\n')
    result = run_gen_model_zoo('--readme', readme)
    assert result.returncode != 0
    assert '<!-- model-zoo:start -->' in result.stderr and 'Traceback' not in result.stderr
    assert readme.read_text() == '# a README without the model-zoo markers\n'


def test_a_paper_result_of_unknown_source_is_refused(tmp_path):
    metafile = copy.deepcopy(METAFILES[-1])
    metafile['Models'][0]['Paper Results']['Source'] = 'blog'
    (tmp_path / 'metafile.yml').write_text(yaml.safe_dump(metafile))
    (tmp_path / 'model-index.yml').write_text('Import:\n  - metafile.yml\n')
    readme = tmp_path / 'README.md'
    shutil.copy(REPO / 'README.md', readme)
    before = readme.read_text()

    result = run_gen_model_zoo('--index', tmp_path / 'model-index.yml', '--readme', readme)
    assert result.returncode != 0
    assert "Source 'blog'" in result.stderr and 'Traceback' not in result.stderr
    assert readme.read_text() == before


def test_h200_hours_are_the_schedules_iterations_times_the_step():
    # a 1x COCO schedule: 12 epochs of 117,266 images at 16 an iteration, 7,330 iterations an epoch
    coco = {'Epochs': 12, 'Batch Size': 16, 'H200 Step (s)': 0.5, 'H200 Memory (GiB)': 6.0}
    assert model_zoo._gpu_cells(coco) == ['0.50', '6.0', f'{0.5 * 12 * 7330 / 3600:.1f}']
    assert model_zoo._gpu_cells({'Iterations': 160000, 'Batch Size': 16, 'H200 Step (s)': 0.2}) == [
        '0.20', '', f'{0.2 * 160000 / 3600:.1f}']
    assert model_zoo._gpu_cells({'Iterations': 80000, 'Batch Size': 16}) == ['', '', '']
