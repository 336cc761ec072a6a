"""Building mmengine's Runner for a tool, and the end of its run: the run's own stops turned into the tool's one
line, and a distributed job's process group closed."""
import importlib
from contextlib import contextmanager

from .distributed import close_distributed
from .errors import build_error_message, fail


def build_runner(cfg):
    """The Runner of ``cfg`` as mmdet's and mmseg's ``train.py`` build it (``runner_type``, else mmengine's)."""
    # also for configs without custom_imports: the hooks, the CPU mixed-precision optim wrapper, and checkpoints
    # (load_from, resume) read as data; a module runs once per process, whether imported here or by the config
    import mala_mm.engine  # noqa: F401
    import mala_mm.safe_loading  # noqa: F401
    runners = importlib.import_module(f'{cfg.default_scope}.registry').RUNNERS
    if 'runner_type' in cfg:
        return runners.build(cfg)
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg)


@contextmanager
def ending_the_run():
    """Around a tool's run: too many undecodable images or skipped steps stop the tool with the reason, not a
    traceback from inside the runner (a checkpoint that cannot be read or does not fit, and backbone arguments
    that cannot build a MALA, reach :func:`tool_main` as they are); then the process group is closed. The runner
    must not be bound to a name in the block: closing a finished run collects it (``close_distributed``)."""
    from mala_mm.datasets import TooManyUndecodableImages
    from mala_mm.engine import TooManySkippedSteps
    finished = False
    try:
        yield
        finished = True
    except (TooManySkippedSteps, TooManyUndecodableImages) as err:
        fail(build_error_message(err))
    finally:
        close_distributed(finished)
