"""What the command-line tools in ``tools/`` share, kept beside them and out of the installed ``mala_mm``: one way
to stop on an error, config loading and checks (the heads' classes against the data's among them), one way from a
config to a model (``build_model``, ``build_backbone``), the distributed set-up that also works without CUDA, the
config changes that fit a run to the machine (printed, and in the dumped config), the refusal to run on CPU where
the machine has GPUs, the offline bundle and the README's model-zoo tables.

A tool run as ``python tools/NAME.py`` finds this package because Python puts the script's folder first on
``sys.path``; the tests have ``tools`` on theirs (pytest.ini).
"""
from .config_check import config_problems
from .device import require_gpus_where_the_machine_has_them
from .errors import ToolError, fail, is_main_process, missing_file, require_file, tool_main
from .head_classes import head_class_problems
from .machine_fit import fit_optim_wrapper_to_device, report_changes
from .model import build_backbone, build_model
from .config import SCOPES, add_common_args, config_errors, load_config, read_config, warn_about_config
from .distributed import setup_distributed
from .preflight import data_problems, missing_weight_files, preflight
from .runner import run_runner

__all__ = [
    'SCOPES', 'ToolError', 'add_common_args', 'build_backbone', 'build_model', 'config_errors', 'config_problems',
    'data_problems', 'fail', 'fit_optim_wrapper_to_device', 'head_class_problems', 'is_main_process', 'load_config',
    'missing_file', 'missing_weight_files', 'preflight', 'read_config', 'report_changes', 'require_file',
    'require_gpus_where_the_machine_has_them', 'run_runner', 'setup_distributed', 'tool_main', 'warn_about_config']
