"""Config adjustments the tools make for the machine they run on."""
from typing import Optional

SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')  # mmcv's names for SyncBatchNorm


def sync_bn_to_bn(node) -> int:
    """Turn every ``type='SyncBN'`` (or another SyncBatchNorm name) in a config node into ``'BN'``, in place;
    returns how many."""
    if isinstance(node, dict):
        count = 0
        if node.get('type') in SYNC_BN_TYPES:
            node['type'] = 'BN'
            count += 1
        return count + sum(sync_bn_to_bn(value) for value in node.values())
    if isinstance(node, (list, tuple)):
        return sum(sync_bn_to_bn(value) for value in node)
    return 0


def fit_optim_wrapper_to_device(optim_wrapper: dict, amp: bool, cuda: bool) -> Optional[str]:
    """Set ``optim_wrapper`` (in place) to the mixed precision the device runs: with ``amp``, fp16 on CUDA (a
    config's own ``AmpOptimWrapper`` keeps its loss scale, the paper configs' static 512; any other wrapper gets a
    dynamic one) and bfloat16 on CPU (which needs no loss scale). Without CUDA a config's own fp16
    ``AmpOptimWrapper`` becomes fp32 training: fp16 autocast needs CUDA, and mmcv's CPU ops (nms) do not take
    bfloat16 either. Returns a line saying so in that case, else None."""
    if amp and cuda:
        if optim_wrapper.get('type') != 'AmpOptimWrapper':
            optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic')
        return None
    if cuda or not (amp or optim_wrapper.get('type') == 'AmpOptimWrapper'):
        return None
    for cuda_only in ('loss_scale', 'dtype'):
        optim_wrapper.pop(cuda_only, None)
    if amp:
        optim_wrapper['type'] = 'CPUAmpOptimWrapper'
        return None
    optim_wrapper['type'] = 'OptimWrapper'
    return ('AmpOptimWrapper -> OptimWrapper: fp16 mixed precision needs CUDA, so this run trains in fp32 '
            '(--amp trains in bfloat16 on CPU)')
