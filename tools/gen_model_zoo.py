"""Render README.md's model-zoo tables from model-index.yml and the metafiles it imports.

Only the text between ``<!-- model-zoo:start -->`` and ``<!-- model-zoo:end -->`` is replaced; one table per
metafile, one row per entry. Unknown values (null in the metafile) are left as empty cells.

Examples:
    python tools/gen_model_zoo.py            # rewrite the tables in README.md
    python tools/gen_model_zoo.py --check    # exit 2 if README.md is not what the metafiles give
"""
import argparse
from pathlib import Path
from typing import List

import yaml

from mala_mm.cli import fail, require_file

REPO = Path(__file__).resolve().parents[1]
START, END = '<!-- model-zoo:start -->', '<!-- model-zoo:end -->'


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


def _row(cells: List[str]) -> str:
    return '|' + '|'.join(f' {cell} ' if cell else ' ' for cell in cells) + '|'


def render_table(metafile: dict) -> str:
    """One Markdown table: config, method, backbone, schedule, params, FLOPs, then every metric of the file."""
    models = metafile['Models']
    results = [result for model in models for result in model.get('Results', [])]
    metrics = list(dict.fromkeys(name for result in results for name in result['Metrics']))
    datasets = ', '.join(dict.fromkeys(result['Dataset'] for result in results))
    header = ['config', 'method', 'backbone', 'schedule', 'params (M)', 'FLOPs (G)', 'of which attention',
              *metrics, 'weights']
    lines = [f'**{datasets}**', '', _row(header), '|' + '---|' * len(header)]
    for model in models:
        try:
            meta = model['Metadata']
            values = {name: value for result in model['Results'] for name, value in result['Metrics'].items()}
            row = [f'[{model["Name"]}]({model["Config"]})', model['In Collection'], meta['Backbone'],
                   meta['Schedule'], _cell(meta.get('Parameters (M)'), '.2f'), _flops_cell(meta),
                   _cell(meta.get('Attention FLOPs (G)'), '.1f'), *(_cell(values.get(name)) for name in metrics),
                   f'[model]({model["Weights"]})' if model.get('Weights') else '']
        except KeyError as err:
            fail(f'metafile entry {model.get("Name", model)!r} has no {err}')
        lines.append(_row(row))
    return '\n'.join(lines)


def render_readme(readme: str, metafiles: List[dict]) -> str:
    """``readme`` with the text between the markers replaced by the tables."""
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        fail(f'the README must contain {START} and, after it, {END}, once each')
    head, rest = readme.split(START)
    _, tail = rest.split(END)
    tables = '\n\n'.join(render_table(metafile) for metafile in metafiles)
    return f'{head}{START}\n{tables}\n{END}{tail}'


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true', help='do not write; exit 2 if the README is stale')
    parser.add_argument('--index', type=Path, default=REPO / 'model-index.yml', help='the model index')
    parser.add_argument('--readme', type=Path, default=REPO / 'README.md', help='the README to update')
    return parser.parse_args()


def main():
    args = parse_args()
    require_file(str(args.readme), 'README')
    readme = args.readme.read_text()
    rendered = render_readme(readme, load_metafiles(args.index))
    if args.check:
        if rendered != readme:
            fail(f'{args.readme}: the model-zoo tables differ from {args.index}; run python tools/gen_model_zoo.py')
        print(f'{args.readme}: model-zoo tables are up to date')
    elif rendered != readme:
        args.readme.write_text(rendered)
        print(f'{args.readme}: model-zoo tables rewritten from {args.index}')
    else:
        print(f'{args.readme}: already up to date')


if __name__ == '__main__':
    main()
