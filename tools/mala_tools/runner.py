"""Building mmengine's Runner for a tool and running it, its errors turned into the tool's one line."""
import importlib

from .distributed import close_distributed
from .errors import build_error_message, fail


def build_runner(cfg):
    # also for configs without custom_imports: the hooks, the CPU mixed-precision optim wrapper, and checkpoints
    # (load_from, resume) read as data; a module runs once per process, whether imported here or by the config
    import mala_mm.engine  # noqa: F401
    import mala_mm.safe_loading  # noqa: F401
    runners = importlib.import_module(f'{cfg.default_scope}.registry').RUNNERS
    if 'runner_type' in cfg:
        return runners.build(cfg)
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg)


def run_runner(cfg, action: str):
    """``build_runner(cfg).<action>()``; too many undecodable images or skipped steps stop the tool with the
    reason, not a traceback from inside the runner (a checkpoint that cannot be read or does not fit, and
    backbone arguments that cannot build a MALA, reach :func:`tool_main` as they are)."""
    from mala_mm.datasets import TooManyUndecodableImages
    from mala_mm.engine import TooManySkippedSteps
    finished = False
    try:
        getattr(build_runner(cfg), action)()  # the runner is not kept: close_distributed collects it
        finished = True
    except (TooManySkippedSteps, TooManyUndecodableImages) as err:
        fail(build_error_message(err))
    finally:
        close_distributed(finished)
