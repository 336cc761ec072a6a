"""Writing the ONNX graph with either of torch's exporters."""
import inspect
import warnings
from typing import Dict, List

import torch
from torch import Tensor

from .errors import ExportError
from .regions import ROI_ALIGN_OPSET
from .wrapper import ImageToTensors

EXPORTERS = ('dynamo', 'torchscript')
# whether torch.onnx.export chooses between its exporters (torch 2.5 and newer; before, it is TorchScript's)
_TAKES_DYNAMO = 'dynamo' in inspect.signature(torch.onnx.export).parameters
# dynamo where torch has it (torch's own default from 2.9), else the only one there is (torch 2.1 to 2.4)
DEFAULT_EXPORTER = 'dynamo' if _TAKES_DYNAMO else 'torchscript'
# the newest opset the TorchScript exporter writes: 17 in torch 2.1, 20 in torch 2.13
_TORCHSCRIPT_MAX_OPSET = getattr(torch.onnx._constants, 'ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET', 17)
# opset 18 (ReduceMean's axes as an input), or where the installed TorchScript exporter stops below it, its newest
DEFAULT_OPSET = min(18, _TORCHSCRIPT_MAX_OPSET)


def export_onnx(module: ImageToTensors, example: Tensor, path: str, dynamic: bool = False,
                opset: int = DEFAULT_OPSET, exporter: str = DEFAULT_EXPORTER) -> List[str]:
    """Write ``module`` traced on ``example`` to ``path``; with ``dynamic``, batch, height and width are free.

    Returns the output names.
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; choose one of {EXPORTERS}')
    if exporter == 'torchscript' and opset > _TORCHSCRIPT_MAX_OPSET:
        raise ExportError(f"torch {torch.__version__}'s TorchScript exporter writes opset {_TORCHSCRIPT_MAX_OPSET} at "
                          f'most; got `opset` {opset}')
    detections = module.nms
    if detections and (exporter != 'torchscript' or example.shape[0] != 1):
        raise ExportError('`nms=True` exports the detections of one image with the TorchScript exporter: pass '
                          "`exporter='torchscript'` (the dynamo exporter has no lowering of NMS)")
    if detections and module.kind == 'two-stage detector' and opset < ROI_ALIGN_OPSET:
        raise ExportError(f'a two-stage detector\'s detections need ONNX\'s RoiAlign of opset {ROI_ALIGN_OPSET} or '
                          f'later (mmcv\'s aligned sampling); got `opset` {opset}')
    module.eval()
    with torch.no_grad():
        names = module.describe_outputs(module(example))
    options: Dict[str, object] = dict(input_names=['image'], output_names=names, opset_version=opset)
    if exporter == 'dynamo':
        if dynamic:
            options['dynamic_shapes'] = ({0: torch.export.Dim('batch', max=1024),
                                          2: torch.export.Dim('height', min=32, max=16384),
                                          3: torch.export.Dim('width', min=32, max=16384)}, )
    elif dynamic:
        free = {2: 'height', 3: 'width'} if detections else {0: 'batch', 2: 'height', 3: 'width'}
        options['dynamic_axes'] = {'image': free, **{name: {0: 'detections'} for name in names if detections}}
        if 'masks' in names:
            options['dynamic_axes']['masks'] = {0: 'detections', 1: 'height', 2: 'width'}
    if _TAKES_DYNAMO:
        options['dynamo'] = exporter == 'dynamo'
    elif exporter == 'dynamo':
        raise ExportError(f"torch {torch.__version__}'s torch.onnx.export has no dynamo exporter (torch 2.5 and newer "
                          "have it): pass `exporter='torchscript'`")
    try:
        with warnings.catch_warnings():
            # the tracer warns of every shape read as a number; which of them hold at other sizes is what the
            # comparison at an unseen size checks
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            torch.onnx.export(module, (example, ), path, **options)
    except Exception as err:  # the exporters raise many types; the first line says which operator failed
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f'torch.onnx.export ({exporter}) could not export {type(module.model).__name__}: '
                          f'{first_line}') from err
    return names
