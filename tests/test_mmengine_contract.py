"""What AtomicCheckpointHook (mala_mm/engine/hooks.py) takes from mmengine's CheckpointHook beyond its public API:
the private methods it overrides, the attributes it reads and writes, and the calls through which mmengine reaches
the overrides. mmengine's checkpoint_hook.py is the same file in 0.10.0 to 0.10.7, the versions setup.py allows; a
release that changes any of these fails here, naming it, before a resumed run could lose a checkpoint."""
import inspect
import re

import pytest
from mmengine.hooks import CheckpointHook

from mala_mm.engine import AtomicCheckpointHook

OVERRIDDEN = {
    '_save_checkpoint_with_step': ['self', 'runner', 'step', 'meta'],
    '_save_best_checkpoint': ['self', 'runner', 'metrics'],
}
CALLED = {'_init_rule': ['self', 'rules', 'key_indicators']}
# mmengine's own code that must still call the overrides
CALLS = {'_save_checkpoint': 'self._save_checkpoint_with_step(runner, ',
         'after_val_epoch': 'self._save_best_checkpoint(runner, '}
ATTRIBUTES = ['keep_ckpt_ids', 'best_ckpt_path_dict', 'init_value_map', 'is_better_than', 'key_indicators',
              'rules', 'last_ckpt', 'best_ckpt_path', 'file_backend', 'filename_tmpl', 'out_dir', 'max_keep_ckpts',
              'save_best', 'by_epoch', 'file_client_args', 'backend_args', 'save_optimizer', 'save_param_scheduler',
              'args']


def changed(what: str) -> str:
    return (f"mmengine's CheckpointHook changed {what}, on which AtomicCheckpointHook relies "
            '(mala_mm/engine/hooks.py); check the hook against this mmengine before allowing it in setup.py')


@pytest.mark.parametrize('name, parameters', {**OVERRIDDEN, **CALLED}.items())
def test_the_private_methods_are_there_with_their_signatures(name, parameters):
    method = getattr(CheckpointHook, name, None)
    assert method is not None, changed(f'{name}: it is gone')
    assert list(inspect.signature(method).parameters) == parameters, changed(f"{name}'s parameters")


@pytest.mark.parametrize('caller, call', CALLS.items())
def test_mmengine_still_reaches_the_overrides(caller, call):
    assert call in inspect.getsource(getattr(CheckpointHook, caller)), changed(f'{caller}, which no longer calls '
                                                                               f'{call.split("(")[0]}')


def test_the_attributes_it_reads_are_set():
    """Set by the constructor, or (for the file backend and output folder) by before_train; the second are
    named in before_train's source."""
    hook = AtomicCheckpointHook(interval=1, save_best=['mIoU', 'aAcc'], max_keep_ckpts=2)
    set_in_before_train = inspect.getsource(CheckpointHook.before_train)
    missing = [name for name in ATTRIBUTES if not hasattr(hook, name)
               and not re.search(rf'self\.{name}(: \w+)? =', set_in_before_train)]
    assert missing == [], changed(f'the attributes {missing}')
