# What every config here runs with, detection and segmentation, paper and built-in: the modules that register the
# types the configs name (mala_mm: the MALA backbone; mala_mm.engine: the hooks below, AtomicCheckpointHook and
# the CPU mixed-precision optim wrapper that tools/train.py --amp picks on CPU) and the one that makes mmengine
# read checkpoints as data (mala_mm.safe_loading: under torch >= 2.6, mmdet's and mmseg's own tools and inferencers
# then load and resume mmengine's checkpoints), so that mmdet's and mmseg's own tools run them too; and the hooks with which random draws repeat on resume and every rank's norm statistics are
# the saved model's (mala_mm.engine.hooks), and the count of optimizer steps that fp16's loss scaler skipped, which
# stops a run that skips more than a tenth of them (mala_mm.engine.skipped_steps).
custom_imports = dict(imports=['mala_mm', 'mala_mm.engine', 'mala_mm.safe_loading'], allow_failed_imports=False)
custom_hooks = [dict(type='IterationSeedHook'), dict(type='SyncNormStatsHook'), dict(type='SkippedStepsHook')]
