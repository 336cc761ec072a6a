"""Render README.md's model-zoo tables from model-index.yml and the metafiles it imports, and its variant table
from ``MALA.arch_zoo``.

Only the text between ``<!-- model-zoo:start -->`` and ``<!-- model-zoo:end -->`` and between
``<!-- variants:start -->`` and ``<!-- variants:end -->`` is replaced. The model zoo: one table per
metafile, one row per entry, then a note naming where the paper's numbers come from. Each metric has two
columns: the paper's (an entry's ``Paper Results``, the target) and this project's (its ``Results``, what a
training run of the config measured). Unknown values (null in the metafile) are left as empty cells. The
variants: one row per named arch, with the parameters of its backbone as built.

Examples:
    python tools/gen_model_zoo.py            # rewrite the tables in README.md
    python tools/gen_model_zoo.py --check    # exit 2 if README.md is not what the metafiles and arch_zoo give
"""
import argparse
import math
import textwrap
from pathlib import Path
from typing import List, Tuple

import yaml

from mala_mm import MALA

from .errors import fail, require_file

START, END = '<!-- model-zoo:start -->', '<!-- model-zoo:end -->'
VARIANTS_START, VARIANTS_END = '<!-- variants:start -->', '<!-- variants:end -->'
# what each pair of markers holds and where it comes from, as --check names it
SECTIONS = {'the model-zoo tables (from the metafiles)': (START, END),
            'the variant table (from MALA.arch_zoo)': (VARIANTS_START, VARIANTS_END)}

# Where a ``Paper Results`` entry's numbers come from (its ``Source``): the mark its cells carry in the README and
# what the note under the tables says of them. A source missing here is refused, as the note could not name it.
PAPER_SOURCES = {
    'paper': ('†', "† from the paper's text"),
    'secondary': ('', 'unmarked: from the `MAViT` entry of the '
                      '[heedless-backbones](https://github.com/igm503/heedless-backbones) results database, '
                      'extracted from the paper by a language model and checked against its text, not yet '
                      "checked here against the paper's PDF"),
}


def load_metafiles(index: Path) -> List[dict]:
    """The metafiles imported by ``index``, each as loaded, in import order (paths relative to the index)."""
    imports = (yaml.safe_load(index.read_text()) or {}).get('Import') or []
    if not imports:
        fail(f'{index} imports no metafile')
    metafiles = []
    for name in imports:
        path = index.parent / name
        if not path.is_file():
            fail(f'{index} imports {name}, which does not exist')
        metafiles.append(yaml.safe_load(path.read_text()))
    return metafiles


def _cell(value, fmt: str = '') -> str:
    return '' if value is None else format(value, fmt)


def _flops_cell(meta: dict) -> str:
    # a starred count is explained under the table
    flops = _cell(meta.get('FLOPs (G)'), '.1f')
    return flops + '*' if flops and meta.get('FLOPs note') else flops


# COCO train2017 less its images without annotations, which mmdet's filter_empty_gt drops: an epoch's iterations
COCO_TRAIN_IMAGES = 117_266


def _iterations(meta: dict) -> int:
    """The schedule's iterations: ``Iterations``, or ``Epochs`` of COCO at ``Batch Size`` images an iteration."""
    if 'Iterations' in meta:
        return meta['Iterations']
    return meta['Epochs'] * math.ceil(COCO_TRAIN_IMAGES / meta['Batch Size'])


def _gpu_cells(meta: dict) -> List[str]:
    """A training step's time and peak memory on one H200 where measured, and the schedule's hours at that step."""
    step = meta.get('H200 Step (s)')
    hours = None if step is None else step * _iterations(meta) / 3600
    return [_cell(step, '.2f'), _cell(meta.get('H200 Memory (GiB)'), '.1f'), _cell(hours, '.1f')]


def _row(cells: List[str]) -> str:
    return '|' + '|'.join(f' {cell} ' if cell else ' ' for cell in cells) + '|'


def _paper_results(model: dict) -> dict:
    """The entry's ``Paper Results`` (``Source`` and ``Metrics``), or an empty one when the paper has no row."""
    paper = model.get('Paper Results')
    if paper is None:
        return {'Source': None, 'Metrics': {}}
    name = model.get('Name', model)
    if not isinstance(paper, dict) or not isinstance(paper.get('Metrics'), dict):
        fail(f'metafile entry {name!r}: Paper Results must hold Source and a Metrics mapping')
    if paper.get('Source') not in PAPER_SOURCES:
        fail(f'metafile entry {name!r}: Paper Results Source {paper.get("Source")!r} is none of '
             f'{", ".join(PAPER_SOURCES)}')
    return paper


def _measured_results(model: dict) -> dict:
    """Metric name to value over all of the entry's ``Results``."""
    return {name: value for result in model['Results'] for name, value in result['Metrics'].items()}


def _metric_names(models: List[dict]) -> List[str]:
    """Every metric measured or reported for the file's entries, in first-seen order."""
    names = [name for model in models for name in _measured_results(model)]
    names += [name for model in models for name in _paper_results(model)['Metrics']]
    return list(dict.fromkeys(names))


def render_table(metafile: dict) -> str:
    """One Markdown table: config, method, backbone, schedule, params, FLOPs, then the paper's value of every
    metric of the file, then the measured value of each, then the weights."""
    models = metafile['Models']
    try:
        metrics = _metric_names(models)
        datasets = ', '.join(dict.fromkeys(result['Dataset'] for model in models for result in model['Results']))
    except KeyError as err:
        fail(f'a metafile entry has no {err}')
    header = ['config', 'method', 'backbone', 'schedule', 'params (M)', 'FLOPs (G)', 'of which attention',
              'H200 step (s)', 'H200 memory (GiB)', '8 x H200 hours',
              *(f'paper {name}' for name in metrics), *(f'measured {name}' for name in metrics), 'weights']
    lines = [f'**{datasets}**', '', _row(header), '|' + '---|' * len(header)]
    for model in models:
        try:
            meta = model['Metadata']
            measured = _measured_results(model)
            paper = _paper_results(model)
            mark = PAPER_SOURCES[paper['Source']][0] if paper['Source'] else ''
            paper_cells = [_cell(paper['Metrics'].get(name), '.1f') for name in metrics]
            row = [f'[{model["Name"]}]({model["Config"]})', model['In Collection'], meta['Backbone'],
                   meta['Schedule'], _cell(meta.get('Parameters (M)'), '.2f'), _flops_cell(meta),
                   _cell(meta.get('Attention FLOPs (G)'), '.1f'), *_gpu_cells(meta),
                   *(cell + mark if cell else '' for cell in paper_cells),
                   *(_cell(measured.get(name), '.1f') for name in metrics),
                   f'[model]({model["Weights"]})' if model.get('Weights') else '']
        except KeyError as err:
            fail(f'metafile entry {model.get("Name", model)!r} has no {err}')
        lines.append(_row(row))
    return '\n'.join(lines)


def render_sources_note(metafiles: List[dict]) -> str:
    """The note under the tables: what each column group holds and where the paper's numbers come from, for
    the sources the metafiles use."""
    used = {_paper_results(model)['Source'] for metafile in metafiles for model in metafile['Models']}
    sources = '; '.join(PAPER_SOURCES[source][1] for source in PAPER_SOURCES if source in used)
    note = (f"Paper columns: the paper's results, each row's target{f' ({sources})' if sources else ''}. Measured "
            "columns: this project's own training and testing of the config, empty until the row is trained. "
            "H200 columns: one training step of the config on one NVIDIA H200 at its per-GPU batch, through its "
            "optim wrapper, and its peak memory "
            "([how](benchmarks/results/h200/README.md); the attention then ran in torch operators); 8 x H200 "
            "hours: the schedule's iterations times that step, without data loading and the gradients' exchange "
            "between GPUs; empty where not measured.")
    return textwrap.fill(note, width=115, break_long_words=False, break_on_hyphens=False)


def variant_names() -> List[str]:
    """The names of MALA's variants in ``arch_zoo`` order, without the one-letter aliases (which share the
    spec of a named variant)."""
    names, specs = [], []
    for name, spec in MALA.arch_zoo.items():
        if not any(spec is seen for seen in specs):
            names.append(name)
            specs.append(spec)
    return names


def render_variant_table() -> str:
    """One Markdown row per variant: its widths, depths, heads and drop path rate as ``MALA.arch_zoo`` gives them,
    and the parameters of its backbone as built with the default arguments (every stage's output norm)."""
    header = ['variant', 'widths', 'depths', 'heads', 'drop path', 'backbone params']
    lines = [_row(header), '|' + '---|' * len(header)]
    for name in variant_names():
        spec = MALA.arch_zoo[name]
        params = sum(p.numel() for p in MALA(name).parameters())
        lists = [', '.join(map(str, spec[key])) for key in ('embed_dims', 'depths', 'num_heads')]
        lines.append(_row([name, *lists, f'{spec["drop_path_rate"]:g}', f'{params:,}']))
    return '\n'.join(lines)


def _split_at_markers(readme: str, start: str, end: str) -> Tuple[str, str, str]:
    """The text before ``start``, between the markers and after ``end``."""
    if readme.count(start) != 1 or readme.count(end) != 1 or readme.index(start) > readme.index(end):
        fail(f'the README must contain {start} and, after it, {end}, once each')
    head, rest = readme.split(start)
    between, tail = rest.split(end)
    return head, between, tail


def _replace_between(readme: str, start: str, end: str, text: str) -> str:
    head, _, tail = _split_at_markers(readme, start, end)
    return f'{head}{start}\n{text}\n{end}{tail}'


def render_readme(readme: str, metafiles: List[dict]) -> str:
    """``readme`` with the model-zoo tables and the note under them, and the variant table, between their
    markers."""
    tables = '\n\n'.join(render_table(metafile) for metafile in metafiles)
    readme = _replace_between(readme, START, END, f'{tables}\n\n{render_sources_note(metafiles)}')
    return _replace_between(readme, VARIANTS_START, VARIANTS_END, render_variant_table())


def stale_sections(readme: str, rendered: str) -> List[str]:
    """The names of the sections (:data:`SECTIONS`) whose text differs between ``readme`` and ``rendered``."""
    return [name for name, (start, end) in SECTIONS.items()
            if _split_at_markers(readme, start, end)[1] != _split_at_markers(rendered, start, end)[1]]


def parse_args(repo: Path):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true', help='do not write; exit 2 if the README is stale')
    parser.add_argument('--index', type=Path, default=repo / 'model-index.yml', help='the model index')
    parser.add_argument('--readme', type=Path, default=repo / 'README.md', help='the README to update')
    return parser.parse_args()


def main(repo: Path = Path('.')):
    """The command; ``repo`` is the checkout whose model index and README are the defaults."""
    args = parse_args(repo)
    require_file(str(args.readme), 'README')
    readme = args.readme.read_text()
    rendered = render_readme(readme, load_metafiles(args.index))
    if args.check:
        if rendered != readme:
            fail(f'{args.readme}: out of date: {" and ".join(stale_sections(readme, rendered))}; run '
                 'python tools/gen_model_zoo.py')
        print(f'{args.readme}: model-zoo and variant tables are up to date')
    elif rendered != readme:
        args.readme.write_text(rendered)
        print(f'{args.readme}: model-zoo and variant tables rewritten from {args.index} and MALA.arch_zoo')
    else:
        print(f'{args.readme}: already up to date')
