"""Running an exported graph in ONNX Runtime and comparing its outputs with PyTorch's."""
import math
from typing import Dict, List, Sequence

import torch
from torch import Tensor

from .errors import ExportError
from .wrapper import ImageToTensors


def compare_in_onnxruntime(reference: ImageToTensors, path: str, image: Tensor) -> List[Dict[str, float]]:
    """Run ``path`` in ONNX Runtime (CPU) and ``reference`` (best built with ``exportable=False``) in PyTorch on
    ``image``; per output, the largest absolute difference and that over the largest absolute PyTorch value."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    with torch.no_grad():
        expected = reference.eval()(image)
    try:
        produced = session.run(None, {session.get_inputs()[0].name: image.numpy()})
    except Exception as err:  # onnxruntime's errors (shape mismatch of a static graph, ...) share no base class
        raise ExportError(f'ONNX Runtime could not run {path} on an input of shape {tuple(image.shape)}: '
                          f'{str(err).strip().splitlines()[0]}') from err
    produced = [torch.from_numpy(output) for output in produced]
    if reference.detections is not None:
        produced = pair_detections(expected, produced)
    rows = []
    for name, ours, theirs in zip(reference.describe_outputs(expected), expected, produced):
        if theirs.shape != ours.shape:
            raise ExportError(f'output {name}: ONNX Runtime gives shape {tuple(theirs.shape)}, PyTorch '
                              f'{tuple(ours.shape)}')
        if ours.numel() == 0:  # a detector that finds nothing, in both
            max_abs = scale = 0.0
        else:
            max_abs = (theirs.double() - ours.double()).abs().max().item()
            scale = ours.double().abs().max().item()
        rows.append(dict(output=name, shape=tuple(ours.shape), max_abs=max_abs,
                         max_rel=max_abs / scale if scale else max_abs))
    return rows


def pair_detections(expected: Sequence[Tensor], produced: Sequence[Tensor]) -> List[Tensor]:
    """ONNX Runtime's (boxes, scores, labels) reordered to pair with PyTorch's, detection by detection.

    Both list the detections best first, but where two scores differ by less than the engines' rounding (an
    untrained head gives many such near-ties) the order of the two may differ. Each PyTorch detection, best
    first, is paired with the nearest unpaired box of its class; the differences of the pairs are then what the
    comparison measures, so a box that only one engine keeps shows as a large one.
    """
    boxes, _, labels = expected
    their_boxes, _, their_labels = produced
    if len(their_boxes) != len(boxes):
        raise ExportError(f'ONNX Runtime finds {len(their_boxes)} detections, PyTorch {len(boxes)}')
    distance = (boxes[:, None].double() - their_boxes[None].double()).abs().amax(-1)
    distance[labels[:, None] != their_labels[None]] = math.inf
    pairs = []
    for detection, row in enumerate(distance):
        partner = int(row.argmin())
        if math.isinf(row[partner]):
            raise ExportError(f'PyTorch detection {detection} (class {int(labels[detection])}) has no ONNX Runtime '
                              f'detection of its class left to pair with')
        pairs.append(partner)
        distance[:, partner] = math.inf
    index = torch.tensor(pairs, dtype=torch.long)
    return [output[index] for output in produced]
