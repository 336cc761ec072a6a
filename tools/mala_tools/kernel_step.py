"""One training step of a config's backbone on a device, at the config's training size and precision, with
impl='auto': each kernel variant the run would launch is checked against the torch operators and timed there
(mala_mm.ops.verdicts), and the table of choices logged. ``tools/check_kernels.py CONFIG``."""
import copy
from typing import Iterator, Optional, Sequence, Tuple

import torch
from mmengine.config import Config
from mmengine.logging import MMLogger

from .config_tree import config_dicts
from .errors import fail
from .machine_fit import fit_optim_wrapper_to_device
from .model import build_backbone


def training_size(cfg: Config) -> Tuple[int, int]:
    """(H, W) of the config's training images: its crop size, else the largest scale its training pipeline resizes
    to, its longer side the width, each side padded to the data preprocessor's size divisor."""
    if cfg.get('crop_size'):
        height, width = cfg.crop_size
    else:
        scales = list(_scales(cfg.train_dataloader.dataset))
        if not scales:
            fail(f'{cfg.filename}: no crop_size, and no scale in the training pipeline: give --shape H W')
        height, width = sorted(max(scales, key=lambda scale: scale[0] * scale[1]))
    divisor = cfg.model.get('data_preprocessor', {}).get('pad_size_divisor') or 1
    return -(-height // divisor) * divisor, -(-width // divisor) * divisor


def _scales(dataset: dict) -> Iterator[Tuple[int, int]]:
    """Every (w, h) pair that a 'scale' or 'scales' key of the dataset's config names, however nested."""
    for _, node in config_dicts(dataset, 'train_dataloader.dataset'):
        named = [node.get('scale')] + list(node.get('scales') or ())
        yield from (tuple(scale) for scale in named if _is_pair(scale))


def _is_pair(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(side, int) for side in value)


def step_dtype(cfg: Config, amp: bool, device: torch.device) -> Optional[torch.dtype]:
    """The dtype the config's training autocasts to on ``device`` (with tools/train.py's ``--amp`` where ``amp``),
    or None for fp32."""
    wrapper = copy.deepcopy(cfg.optim_wrapper)
    fit_optim_wrapper_to_device(wrapper, amp, device.type == 'cuda')
    if wrapper.get('type') == 'CPUAmpOptimWrapper':
        return torch.bfloat16
    if wrapper.get('type') != 'AmpOptimWrapper':
        return None
    return getattr(torch, wrapper.get('dtype') or 'float16')


def backbone_of(cfg: Config):
    """The config's MALA backbone with random weights (a check needs no pretrained ones), BatchNorm for SyncBN as
    mmengine's runner takes it in one process."""
    backbone = dict(cfg.model.backbone)
    if (backbone.get('norm_cfg') or {}).get('type') == 'SyncBN':
        backbone['norm_cfg'] = dict(backbone['norm_cfg'], type='BN')
    return build_backbone(backbone, source=f'{cfg.filename}: model.backbone')


def check_config(path: str, device: torch.device, images: Optional[int], amp: bool,
                 shape: Optional[Sequence[int]]) -> None:
    """A training step of the backbone of the config at ``path`` on ``device``, for ``images`` images (default: its
    batch size) of ``shape`` (default: :func:`training_size`); stops where a variant computes other numbers than
    its torch operators or fails to run."""
    cfg = Config.fromfile(path)
    MMLogger.get_instance('check_kernels', log_level='INFO')  # the table of choices, on stdout
    height, width = shape or training_size(cfg)
    dtype = step_dtype(cfg, amp, device)
    model = backbone_of(cfg).to(device).train()
    x = torch.randn(images or cfg.train_dataloader.batch_size, 3, height, width, device=device)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        outputs = model(x)
    sum(out.float().mean() for out in outputs).backward()
    from mala_mm.ops import verdicts
    wrong = [verdict for verdict in verdicts.VERDICTS.known.values() if not verdict.right]
    if wrong:
        fail(f"on {device}, the kernels of {', '.join(v.variant for v in wrong)} compute other numbers than the "
             f"torch operators or do not run: impl='auto' runs those in torch operators (with a warning), "
             f"impl='triton' stops")
