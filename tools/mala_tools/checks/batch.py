"""The total batch of a run against the one its recipe's learning rate is set for."""
from typing import Optional


def batch_notice(cfg, processes: int) -> Optional[str]:
    """One line where ``processes`` processes of ``cfg.train_dataloader.batch_size`` images each make a total batch
    other than the ``auto_scale_lr.base_batch_size`` that the config's learning rate is set for, naming both and the
    flag that scales the rate; None where they agree, where the rate is scaled already, or where the config names no
    base batch."""
    auto_scale_lr = cfg.get('auto_scale_lr') or {}
    base = auto_scale_lr.get('base_batch_size')
    per_process = (cfg.get('train_dataloader') or {}).get('batch_size')
    if base is None or per_process is None or auto_scale_lr.get('enable', False):
        return None
    total = processes * per_process
    if total == base:
        return None
    processes_named = f'{processes} process' + ('es' if processes > 1 else '')
    return (f'note: this run trains a total batch of {total} images ({processes_named} x {per_process}), and the '
            f"config's learning rate is set for {base} (auto_scale_lr.base_batch_size): --auto-scale-lr scales it "
            f'by {total}/{base}')
