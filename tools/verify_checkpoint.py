"""Report whether a checkpoint fits a MALA variant before training or testing with it.

Compares the checkpoint's backbone tensors (any format ``MALA`` loads) with the state dict of the variant:
keys missing from the checkpoint, keys the model does not have, and shapes that differ. A checkpoint fits when
no shape differs and the only keys missing or left over are the dense model's output norms
(``extra_norms.*``: ImageNet checkpoints lack them, and they start at their initialisation; a config with fewer
``out_indices`` has fewer of them). Without ``--arch``
or ``--config`` every released variant is tried. Exits 0 when the checkpoint fits (every tried variant it fits
is listed), 1 otherwise.

Examples:
    python tools/verify_checkpoint.py checkpoints/mala_b_in1k.pth --arch base
    python tools/verify_checkpoint.py checkpoints/mala_b_in1k.pth --config configs/detection/mask_rcnn_mala_b.py
"""
import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import torch
from mmengine.config import Config

from mala_mm import MALA
from mala_mm.checkpoint import CheckpointError, extract_backbone_state_dict, safe_load

VARIANTS = ('tiny', 'small', 'base', 'large')
# keys that one side may legitimately lack: the output norms of the dense model's out_indices
OPTIONAL_PREFIXES = ('extra_norms.', )


@dataclass
class Fit:
    """How a backbone state dict compares with a model's."""
    matched: int
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    wrong_shapes: List[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.wrong_shapes and all(
            key.startswith(OPTIONAL_PREFIXES) for key in self.missing + self.unexpected)


def compare(state: Dict[str, torch.Tensor], model: torch.nn.Module) -> Fit:
    own = model.state_dict()
    return Fit(matched=sum(key in own for key in state),
               missing=[key for key in own if key not in state],
               unexpected=[key for key in state if key not in own],
               wrong_shapes=[f'{key}: checkpoint {tuple(state[key].shape)}, model {tuple(own[key].shape)}'
                             for key in state if key in own and state[key].shape != own[key].shape])


def report(name: str, fit: Fit, limit: int = 5) -> None:
    print(f'{name}: {"fits" if fit.fits else "does not fit"} ({fit.matched} keys matched)')
    for title, keys in (('shapes differ', fit.wrong_shapes), ('not in the model', fit.unexpected),
                        ('missing from the checkpoint', fit.missing)):
        if keys:
            more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
            print(f'  {title} ({len(keys)}): ' + '; '.join(keys[:limit]) + more)
    if fit.fits and fit.missing:
        print('  the missing output norms start at their initialisation, as with any ImageNet checkpoint')


def backbones_to_try(args) -> Dict[str, MALA]:
    """{description: backbone} from --config, --arch or every released variant."""
    if args.config:
        if not os.path.isfile(args.config):
            raise SystemExit(f'verify_checkpoint: config file not found: {args.config}')
        backbone = dict(Config.fromfile(args.config).model.backbone)
        if backbone.pop('type', None) != 'MALA':
            raise SystemExit(f'verify_checkpoint: the backbone of {args.config} is not MALA')
        backbone.pop('init_cfg', None)
        return {f'{args.config} ({backbone.get("arch")})': MALA(**backbone)}
    return {arch: MALA(arch=arch) for arch in ([args.arch] if args.arch else VARIANTS)}


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
        sys.exit(f'verify_checkpoint: {err}')
    if not state:
        sys.exit(f'verify_checkpoint: {args.checkpoint} holds no backbone tensor (prefix={args.prefix!r})')
    print(f'{args.checkpoint}: {len(state)} backbone tensors')
    fitting = []
    for name, model in backbones_to_try(args).items():
        fit = compare(state, model)
        report(name, fit)
        if fit.fits:
            fitting.append(name)
    if not fitting:
        sys.exit('verify_checkpoint: the checkpoint fits none of the variants tried')
    print(f'fits: {", ".join(fitting)}')


if __name__ == '__main__':
    main()
