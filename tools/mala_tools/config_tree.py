"""Walking a config's nested dicts and lists, each dict named by the dotted key that ``--cfg-options`` takes
(list items by their index: ``model.roi_head.bbox_head.0``): the one walk of config trees, for the checks and
the changes a tool makes to fit a config to the machine."""
from typing import Container, Iterator, Optional, Tuple


def config_dicts(node, key: str, skip: Container[str] = (),
                 only: Optional[Container[str]] = None) -> Iterator[Tuple[str, dict]]:
    """(dotted key, dict) of ``node`` and every dict inside it, each before its contents. The values of the keys
    in ``skip`` are not entered; with ``only``, nothing but the values of those keys is."""
    if isinstance(node, dict):
        yield key, node
        for name, value in node.items():
            if name not in skip and (only is None or name in only):
                yield from config_dicts(value, f'{key}.{name}', skip, only)
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from config_dicts(value, f'{key}.{index}', skip, only)
