"""Running an exported graph in ONNX Runtime and comparing its outputs with PyTorch's."""
import math
from typing import Dict, List, NamedTuple, Sequence

import torch
from torch import Tensor

from .errors import ExportError
from .wrapper import ImageToTensors

# How far ONNX Runtime's detections may be from mmdet's: boxes, as a share of the image's longer side; scores;
# the intersection over union of each detection's two binary masks; for masks as probabilities (uint8 times 255,
# mask_thr_binary < 0), the share of each mask's pixels where the two differ by more than 0.01. Not the largest
# difference: mmdet on CPU pastes a mask up to a pixel past the floor and ceiling of its box's edges, so an edge
# a rounding away from an integer adds or drops a column of the mask's faint rim (binary masks at thresholds of
# 0.5 and above never hold those pixels)
DETECTION_BOUNDS = dict(boxes=1e-3, scores=1e-4, masks=0.99, mask_probabilities=0.01)


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
        return compare_detections(expected, produced, max(image.shape[2:]))
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


class Pairing(NamedTuple):
    """The detections both engines keep, paired (PyTorch's and ONNX Runtime's outputs, boxes, scores, labels and
    masks, in the order of the pairs), and the detections only one engine keeps: how many in all, and how many of
    those score beyond the score bound of that engine's cutoff (its lowest kept score)."""
    expected: List[Tensor]
    produced: List[Tensor]
    alone: int
    alone_beyond_cutoff: int


def pair_detections(expected: Sequence[Tensor], produced: Sequence[Tensor], image_size: int) -> Pairing:
    """ONNX Runtime's (boxes, scores, labels[, masks]) paired with PyTorch's, detection by detection.

    Both list the detections best first, but where two scores differ by less than the engines' rounding (an
    untrained head gives many such near-ties) the order of the two may differ. Each PyTorch detection, best
    first, is paired with the nearest unpaired box of its class; the differences of the pairs are then what the
    comparison measures, so a box that moved shows as a large one. A near-tie at the cutoff (the top-k kept, or the
    score threshold) can also keep a detection in one engine and another in the other: a pair whose boxes differ
    beyond the bound and whose scores are both within the score bound of their engine's cutoff, and a detection
    left without a partner, count as kept by one engine alone.
    """
    boxes, scores, labels = expected[:3]
    their_boxes, their_scores, their_labels = produced[:3]
    distance = (boxes[:, None].double() - their_boxes[None].double()).abs().amax(-1)
    distance[labels[:, None] != their_labels[None]] = math.inf
    ours, theirs = [], []
    for detection, row in enumerate(distance):
        partner = int(row.argmin()) if len(row) else -1
        if partner >= 0 and not math.isinf(row[partner]):
            ours.append(detection)
            theirs.append(partner)
            distance[:, partner] = math.inf
    at_cutoff = [_at_cutoff(scores), _at_cutoff(their_scores)]
    pairs = [(a, b) for a, b in zip(ours, theirs)
             if not (at_cutoff[0][a] and at_cutoff[1][b] and _box_difference(boxes[a], their_boxes[b])
                     > DETECTION_BOUNDS['boxes'] * image_size)]
    ours, theirs = [a for a, _ in pairs], [b for _, b in pairs]
    paired = [set(ours), set(theirs)]
    alone = [(engine, index) for engine, count in enumerate((len(boxes), len(their_boxes)))
             for index in range(count) if index not in paired[engine]]
    beyond = sum(1 for engine, index in alone if not at_cutoff[engine][index])
    ours_index, theirs_index = torch.tensor(ours, dtype=torch.long), torch.tensor(theirs, dtype=torch.long)
    return Pairing([output[ours_index] for output in expected], [output[theirs_index] for output in produced],
                   len(alone), beyond)


def _box_difference(box: Tensor, other: Tensor) -> float:
    return (box.double() - other.double()).abs().max().item()


def _at_cutoff(scores: Tensor) -> Tensor:
    """Whether each detection scores within the score bound of the lowest score kept."""
    if not len(scores):
        return torch.zeros(0, dtype=torch.bool)
    return scores.double() <= scores.double().min() + DETECTION_BOUNDS['scores']


def compare_detections(expected: Sequence[Tensor], produced: Sequence[Tensor], image_size: int
                       ) -> List[Dict[str, object]]:
    """Per output of the detections both engines keep (:func:`pair_detections`), what differs and whether it is
    within ``DETECTION_BOUNDS``: the largest box coordinate difference over ``image_size``, the largest score
    difference, the number of unequal labels, the smallest mask IoU (1 where both masks are empty) or, for uint8
    masks, the largest share of a mask's pixels off by more than 0.01; then the detections that one engine keeps
    alone beyond the score bound of its cutoff, which must be none."""
    pairing = pair_detections(expected, produced, image_size)
    rows = []
    for name, ours, theirs in zip(['boxes', 'scores', 'labels', 'masks'], pairing.expected, pairing.produced):
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
    rows.append(dict(output='alone', shape=(pairing.alone,), measure='of which beyond the cutoff',
                     value=pairing.alone_beyond_cutoff, bound=0, within=pairing.alone_beyond_cutoff == 0))
    return rows
