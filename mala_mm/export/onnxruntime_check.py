"""Running an exported graph in ONNX Runtime and comparing its outputs with PyTorch's."""
import math
from typing import Dict, List, Sequence

# How far ONNX Runtime's detections may be from mmdet's: boxes, as a share of the image's longer side; scores;
# the intersection over union of each detection's two binary masks; for masks as probabilities (uint8 times 255,
# mask_thr_binary < 0), the share of each mask's pixels where the two differ by more than 0.01. Not the largest
# difference: mmdet on CPU pastes a mask up to a pixel past the floor and ceiling of its box's edges, so an edge
# a rounding away from an integer adds or drops a column of the mask's faint rim (binary masks at thresholds of
# 0.5 and above never hold those pixels)
DETECTION_BOUNDS = dict(boxes=1e-3, scores=1e-4, masks=0.99, mask_probabilities=0.01)

import torch
from torch import Tensor

from .errors import ExportError
from .wrapper import ImageToTensors


def compare_in_onnxruntime(reference: ImageToTensors, path: str, image: Tensor) -> List[Dict[str, float]]:
    """Run ``path`` in ONNX Runtime (CPU) and ``reference`` (best built with ``exportable=False``) in PyTorch on
    ``image``; per output, the largest absolute difference and that over the largest absolute PyTorch value, or
    for detections (``reference.nms``) the rows of :func:`compare_detections`."""
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
    if reference.nms:
        return compare_detections(expected, pair_detections(expected, produced), max(image.shape[2:]))
    rows = []
    for name, ours, theirs in zip(reference.describe_outputs(expected), expected, produced):
        if theirs.shape != ours.shape:
            raise ExportError(f'output {name}: ONNX Runtime gives shape {tuple(theirs.shape)}, PyTorch '
                              f'{tuple(ours.shape)}')
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
    boxes, labels, their_boxes, their_labels = expected[0], expected[2], produced[0], produced[2]
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


def compare_detections(expected: Sequence[Tensor], produced: Sequence[Tensor], image_size: int
                       ) -> List[Dict[str, object]]:
    """Per output of paired detections, what differs and whether it is within ``DETECTION_BOUNDS``: the largest
    box coordinate difference over ``image_size``, the largest score difference, the number of unequal labels,
    the smallest mask IoU (1 where both masks are empty) or, for uint8 masks, the largest share of a mask's pixels
    off by more than 0.01."""
    rows = []
    for name, ours, theirs in zip(['boxes', 'scores', 'labels', 'masks'], expected, produced):
        row = dict(output=name, shape=tuple(ours.shape))
        if name == 'labels':
            row.update(measure='unequal', value=int((ours != theirs).sum()), bound=0)
        elif name == 'masks' and ours.dtype == torch.uint8:  # probabilities times 255, rounded down
            off = (theirs.int() - ours.int()).abs() > 0.01 * 255
            share = off.flatten(1).float().mean(1).max().item() if ours.numel() else 0.0
            row.update(measure='pixels off by > 0.01', value=share, bound=DETECTION_BOUNDS['mask_probabilities'])
        elif name == 'masks':
            ours, theirs = ours.flatten(1).bool(), theirs.flatten(1).bool()
            union = (ours | theirs).sum(1)
            iou = torch.where(union > 0, (ours & theirs).sum(1) / union.clamp(min=1), torch.ones_like(union))
            row.update(measure='min IoU', value=iou.min().item() if len(iou) else 1.0, bound=DETECTION_BOUNDS[name])
        else:
            difference = (theirs.double() - ours.double()).abs().max().item() if ours.numel() else 0.0
            if name == 'boxes':
                row.update(measure='max abs / image size', value=difference / image_size)
            else:
                row.update(measure='max abs', value=difference)
            row['bound'] = DETECTION_BOUNDS[name]
        row['within'] = row['value'] >= row['bound'] if row['measure'] == 'min IoU' else row['value'] <= row['bound']
        rows.append(row)
    return rows
