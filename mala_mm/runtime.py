"""Config adjustments the tools make for the machine they run on."""

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
