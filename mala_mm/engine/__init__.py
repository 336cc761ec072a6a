"""Training-time parts: hooks that let a killed run resume exactly, and mixed precision on CPU.

Not imported by ``import mala_mm``: the configs here import it through their ``custom_imports``, and the tools
when they build a runner."""
from .hooks import AtomicCheckpointHook, IterationSeedHook, SyncNormStatsHook
from .optim_wrapper import CPUAmpOptimWrapper

__all__ = ['AtomicCheckpointHook', 'IterationSeedHook', 'SyncNormStatsHook', 'CPUAmpOptimWrapper']
