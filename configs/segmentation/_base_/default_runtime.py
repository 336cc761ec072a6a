# mmseg's runtime with this project's imports and hooks; in mmseg the schedule sets the default hooks
_base_ = ['mmseg::_base_/default_runtime.py', '../../_base_/mala_runtime.py']
