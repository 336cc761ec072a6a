"""Training-time parts: hooks that let a killed run resume exactly, and mixed precision on CPU."""
from .hooks import AtomicCheckpointHook, IterationSeedHook, SyncNormStatsHook
from .optim_wrapper import CPUAmpOptimWrapper

__all__ = ['AtomicCheckpointHook', 'IterationSeedHook', 'SyncNormStatsHook', 'CPUAmpOptimWrapper']
