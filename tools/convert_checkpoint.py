"""Convert a MALA checkpoint of the authors' release into a tensor-only backbone state dict.

Reads a classification checkpoint (DeiT-style: ``model``, ``model_ema``, ``optimizer``, ``args``...) or a
detector / segmentor checkpoint (``state_dict`` with ``backbone.*``), keeps the backbone's tensors under the
names ``MALA`` uses, and saves them as a plain ``{name: tensor}`` dict that ``torch.load(weights_only=True)``
reads without any allow-list. Prints what was kept, renamed and dropped.

Example:
    python tools/convert_checkpoint.py downloads/MALA_S.pth checkpoints/mala_s_in1k.pth
"""
import argparse
import os
from collections import Counter
from typing import Dict, List

import torch

from mala_mm.checkpoint import CheckpointError, extract_backbone_state_dict, model_state, safe_load
from mala_tools.errors import fail, tool_main


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='release checkpoint (path or http(s) URL)')
    parser.add_argument('dst', help='where to write the backbone state dict')
    parser.add_argument('--ema', action='store_true',
                        help="take a classification checkpoint's EMA weights (`model_ema`) instead of `model`")
    parser.add_argument('--prefix', help="take only keys under this prefix (default: 'backbone.' where present)")
    return parser.parse_args()


def source_tensors(checkpoint: dict, ema: bool) -> Dict[str, torch.Tensor]:
    """The state dict the backbone is taken from, with its original key names."""
    if ema:
        if not isinstance(checkpoint.get('model_ema'), dict):
            raise CheckpointError('--ema: the checkpoint has no `model_ema` state dict '
                                  f'(its entries: {sorted(checkpoint)})')
        return checkpoint['model_ema']
    return model_state(checkpoint)


def summarise_prefixes(names: List[str]) -> str:
    """'backbone.* (120), neck.* (30)': how many names share each first component."""
    counts = Counter(name.split('.')[0] for name in names)
    return ', '.join(f'{first}.* ({count})' for first, count in sorted(counts.items()))


def convert(checkpoint, ema: bool = False, prefix=None) -> Dict[str, torch.Tensor]:
    """Return the backbone state dict of ``checkpoint`` and print what happened to each of its entries."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    source = source_tensors(checkpoint, ema)
    state = extract_backbone_state_dict({'model': source}, prefix)
    if not state:
        raise CheckpointError(f'no backbone tensor found (prefix={prefix!r}); the checkpoint holds '
                              f'{summarise_prefixes(list(source)) or "no tensors"}')
    # extract_backbone_state_dict returns the source's own tensor objects, so identity maps new names to old
    old_names = {id(tensor): name for name, tensor in source.items() if isinstance(tensor, torch.Tensor)}
    renamed = Counter(old_names[id(tensor)][:-len(name)] for name, tensor in state.items()
                      if old_names[id(tensor)] != name)
    kept_ids = {id(tensor) for tensor in state.values()}
    dropped = [name for tensor_id, name in old_names.items() if tensor_id not in kept_ids]
    others = sorted(key for key in checkpoint if checkpoint.get(key) is not source)

    print(f'kept: {len(state)} tensors, {sum(t.numel() for t in state.values()):,} values')
    for old_prefix, count in sorted(renamed.items()):
        print(f"renamed: {count} keys '{old_prefix}*' -> '*'")
    if dropped:
        print(f'dropped tensors: {len(dropped)}: {summarise_prefixes(dropped)}')
    if others and source is not checkpoint:
        print(f'dropped entries: {", ".join(map(str, others))}')
    return state


def main():
    args = parse_args()
    try:
        state = convert(safe_load(args.src), args.ema, args.prefix)
    except (FileNotFoundError, CheckpointError) as err:
        fail(str(err))
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save(state, args.dst)
    print(f'saved {args.dst}; check it fits a variant with: python tools/verify_checkpoint.py {args.dst} --arch ARCH')


if __name__ == '__main__':
    tool_main(main)
