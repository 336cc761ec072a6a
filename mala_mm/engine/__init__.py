"""Training-time parts: hooks that let a killed run resume exactly, mixed precision on CPU, and the count of
optimizer steps that mixed precision skipped.

Not imported by ``import mala_mm``: the configs here import it through their ``custom_imports``, and the tools
when they build a runner."""
from .hooks import AtomicCheckpointHook, IterationSeedHook, SyncNormStatsHook
from .optim_wrapper import CPUAmpOptimWrapper
from .skipped_steps import SkippedStepsHook, TooManySkippedSteps

__all__ = ['AtomicCheckpointHook', 'IterationSeedHook', 'SyncNormStatsHook', 'CPUAmpOptimWrapper', 'SkippedStepsHook',
           'TooManySkippedSteps']
