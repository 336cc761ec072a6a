"""Whether a model's heads predict as many classes as its datasets have. mmdet and mmseg check nothing: a config
for a dataset of 5 classes that keeps a paper config's 80-class heads trains them without a word."""
import importlib
from collections import defaultdict
from typing import Iterator, List, Optional, Tuple

from ..config_tree import config_dicts
from .data_paths import keyed_leaf_datasets

# parts of a model whose num_classes is not the dataset's: an RPN scores objectness, one class
NOT_THE_DATASETS_CLASSES = ('rpn_head', )


def head_class_counts(node, key: str = 'model') -> Iterator[Tuple[str, int]]:
    """(dotted config key, num_classes) of every part of the model config ``node`` that sets ``num_classes``:
    mmdet's box and mask heads (each of Cascade's list of box heads), RetinaNet's head, mmseg's decode and
    auxiliary heads; not an RPN's."""
    for where, part in config_dicts(node, key, skip=NOT_THE_DATASETS_CLASSES):
        if isinstance(part.get('num_classes'), int):
            yield where, part['num_classes']


def dataset_classes(dataset_cfg: dict, scope: str) -> Tuple[Optional[tuple], str]:
    """The classes a dataset config reads, and where they come from: its ``metainfo.classes``, else its dataset
    class's ``METAINFO`` (COCO's 80, ADE20K's 150). (None, '') where neither names them."""
    classes = (dataset_cfg.get('metainfo') or {}).get('classes')
    if classes is not None:
        return tuple(classes), 'its metainfo.classes'
    kind = dataset_cfg.get('type')
    if isinstance(kind, str):
        try:
            kind = importlib.import_module(f'{scope}.registry').DATASETS.get(kind)
        except ImportError:
            return None, ''
    classes = getattr(kind, 'METAINFO', {}).get('classes')
    if classes is None:
        return None, ''
    return tuple(classes), f"{kind.__name__}'s classes; a dataset of your own sets metainfo.classes"


def head_class_problems(cfg, dataloaders) -> List[str]:
    """One line for each number of classes among the datasets of ``dataloaders`` (names such as
    'train_dataloader') that some head's ``num_classes`` differs from, with the keys to set."""
    heads = list(head_class_counts(cfg.get('model')))
    if not heads:
        return []
    datasets_by_count = defaultdict(list)
    for key, dataset_cfg in keyed_leaf_datasets(cfg, dataloaders):
        classes, source = dataset_classes(dataset_cfg, cfg.get('default_scope'))
        if classes is not None:
            datasets_by_count[len(classes)].append(f'{key} ({source})')
    problems = []
    for count, datasets in datasets_by_count.items():
        wrong = [f'{key}.num_classes={num_classes}' for key, num_classes in heads if num_classes != count]
        if wrong:
            have = 'has' if len(datasets) == 1 else 'have'
            problems.append(
                f"the model's heads do not fit the data: {' and '.join(datasets)} {have} {count} classes, but "
                f"{', '.join(wrong)}. Set num_classes={count} in each of them (a config for a dataset of your own: "
                f'docs/custom_dataset.md)')
    return problems
