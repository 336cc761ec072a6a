"""Walking a config's nested dicts and lists, each dict named by the dotted key that ``--cfg-options`` takes
(list items by their index: ``model.roi_head.bbox_head.0``)."""
from typing import Iterable, Iterator, Tuple


def config_dicts(node, key: str, skip: Iterable[str] = ()) -> Iterator[Tuple[str, dict]]:
    """(dotted key, dict) of ``node`` and every dict inside it, each before its contents; the values of the keys
    in ``skip`` are not entered."""
    if isinstance(node, dict):
        yield key, node
        for name, value in node.items():
            if name not in skip:
                yield from config_dicts(value, f'{key}.{name}', skip)
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from config_dicts(value, f'{key}.{index}', skip)
