"""The paper rows a config can be checked against: one per entry of the repository's model-index.yml, each with its
config in configs/.

A row's name says what it trains, ``<method>_mala_<variant>[_<schedule>]`` (``mask_rcnn_mala_s_3x``), so the rows
a config may reproduce are found from its model, head and backbone arch without reading every row's config; the
data it trains on must be the paper's (COCO for detection, ADE20K for segmentation, each with its own classes).
"""
import functools
from pathlib import Path
from typing import List, NamedTuple

from mmengine.config import Config

from ..errors import fail
from .facts import row_key

ROOT = Path(__file__).resolve().parents[3]
MODEL_INDEX = ROOT / 'model-index.yml'
# (model type, decode head type) -> the method part of a row's name
METHODS = {('MaskRCNN', None): 'mask_rcnn', ('CascadeRCNN', None): 'cascade_mask_rcnn',
           ('RetinaNet', None): 'retinanet', ('EncoderDecoder', 'UPerHead'): 'upernet',
           ('EncoderDecoder', 'FPNHead'): 'fpn'}
# the paper's data: COCO and ADE20K with their own classes
PAPER_DATA = (('CocoDataset', None), ('ADE20KDataset', None))
VARIANTS = ('tiny', 'small', 'base', 'large')


class Row(NamedTuple):
    name: str
    config: Path


@functools.lru_cache(maxsize=None)
def paper_rows() -> List[Row]:
    """Every row of the metafiles that model-index.yml imports, in their order."""
    from ..model_zoo import load_metafiles
    if not MODEL_INDEX.is_file():
        fail(f'the paper rows are read from {MODEL_INDEX}, which is not there: run the check from a clone of the '
             'repository')
    return [Row(entry['Name'], ROOT / entry['Config'])
            for metafile in load_metafiles(MODEL_INDEX) for entry in metafile.get('Models', [])]


def find_row(name: str) -> Row:
    rows = {row.name: row for row in paper_rows()}
    if name not in rows:
        fail(f"--row {name}: no such paper row; the rows are {', '.join(rows)}")
    return rows[name]


@functools.lru_cache(maxsize=None)
def row_config(row: Row) -> Config:
    return Config.fromfile(str(row.config))


def candidate_rows(cfg) -> List[Row]:
    """The rows whose method, backbone variant and dataset are the config's: those it may reproduce (a method's 1x
    and 3x rows both, for a Mask R-CNN MALA-S on COCO)."""
    key = row_key(cfg)
    if key is None or key[0] not in VARIANTS or key[3] not in PAPER_DATA or (key[1], key[2]) not in METHODS:
        return []
    stem = f'{METHODS[key[1], key[2]]}_mala_{key[0][0]}'
    return [row for row in paper_rows() if row.name == stem or row.name.startswith(f'{stem}_')]
