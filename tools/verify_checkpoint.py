"""Report whether a checkpoint fits a MALA variant before training or testing with it.

Compares the checkpoint's backbone tensors (any format ``MALA`` loads) with the state dict of the variant:
keys missing from the checkpoint, keys the model does not have, and shapes that differ. A checkpoint fits when
no shape differs and the only keys missing or left over are the dense model's output norms
(``extra_norms.*``: ImageNet checkpoints lack them, and they start at their initialisation; a config with fewer
``out_indices`` has fewer of them). Without ``--arch`` or ``--config`` every released variant is tried. Exits 0
when the checkpoint fits (every tried variant it fits is listed), 2 otherwise.

Examples:
    python tools/verify_checkpoint.py checkpoints/mala_b_in1k.pth --arch base
    python tools/verify_checkpoint.py checkpoints/mala_b_in1k.pth --config configs/detection/mask_rcnn_mala_b.py
"""
import argparse
from typing import Dict

from mala_mm.checkpoint import (CheckpointError, StateDictComparison, compare_state_dict, extract_backbone_state_dict,
                                safe_load)
from mala_mm.models import MALA
from mala_tools.config import read_config
from mala_tools.errors import fail, tool_main
from mala_tools.model import build_backbone

VARIANTS = ('tiny', 'small', 'base', 'large')
# keys that one side may legitimately lack: the output norms of the dense model's out_indices
OPTIONAL_PREFIXES = ('extra_norms.', )


def fits(comparison: StateDictComparison) -> bool:
    return not comparison.wrong_shapes and all(
        key.startswith(OPTIONAL_PREFIXES) for key in comparison.missing + comparison.unexpected)


def report(name: str, comparison: StateDictComparison, limit: int = 5) -> None:
    fit = fits(comparison)
    print(f'{name}: {"fits" if fit else "does not fit"} ({len(comparison.matched)} keys matched)')
    for title, keys in (('shapes differ', comparison.wrong_shapes), ('not in the model', comparison.unexpected),
                        ('missing from the checkpoint', comparison.missing)):
        if keys:
            more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
            print(f'  {title} ({len(keys)}): ' + '; '.join(keys[:limit]) + more)
    if fit and comparison.missing:
        print('  the missing output norms start at their initialisation, as with any ImageNet checkpoint')


def backbones_to_try(args) -> Dict[str, MALA]:
    """{description: backbone} from --config, --arch or every released variant. Only the backbone is built: its
    tensors are what a backbone checkpoint is checked against, and a config's necks and heads would cost time
    and may need packages a backbone check does not."""
    if args.config:
        backbone_cfg = (read_config(args.config).get('model') or {}).get('backbone')
        backbone = build_backbone(backbone_cfg, source=f'the backbone of {args.config}')
        return {f'{args.config} ({backbone_cfg.get("arch")})': backbone}
    return {arch: build_backbone(dict(type='MALA', arch=arch)) for arch in ([args.arch] if args.arch else VARIANTS)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('checkpoint', help='checkpoint file or http(s) URL')
    target = parser.add_mutually_exclusive_group()
    target.add_argument('--arch', choices=VARIANTS, help='the variant to check against')
    target.add_argument('--config', help="a config whose backbone to check against (its 'init_cfg' is ignored)")
    parser.add_argument('--prefix', help="take only keys under this prefix (default: 'backbone.' where present)")
    return parser.parse_args()


def main():
    args = parse_args()
    try:
        state = extract_backbone_state_dict(safe_load(args.checkpoint), args.prefix)
    except (FileNotFoundError, CheckpointError) as err:
        fail(str(err))
    if not state:
        fail(f'{args.checkpoint} holds no backbone tensor (prefix={args.prefix!r})')
    print(f'{args.checkpoint}: {len(state)} backbone tensors')
    fitting = []
    for name, model in backbones_to_try(args).items():
        comparison = compare_state_dict(state, model)
        report(name, comparison)
        if fits(comparison):
            fitting.append(name)
    if not fitting:
        fail('the checkpoint fits none of the variants tried')
    print(f'fits: {", ".join(fitting)}')


if __name__ == '__main__':
    tool_main(main)
