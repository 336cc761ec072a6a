"""Export an mmdet/mmseg model, or its backbone, to ONNX and check the graph in ONNX Runtime.

    python tools/export_onnx.py CONFIG CHECKPOINT --out FILE [--shape H W] [--dynamic] [--opset N]
                                [--backbone-only | --nms] [--exporter dynamo|torchscript] [--image FILE]
    python tools/export_onnx.py CONFIG --random-weights --out FILE ...    # the untrained model: a check of the export

The graph takes a (B, 3, H, W) float32 image, 0-255, channels as the config's pipeline loads them, and
normalises it inside. After writing FILE the tool runs it in ONNX Runtime at the export size and, with
--dynamic, at a size the export never saw (not a multiple of 32), prints the largest absolute and relative
difference of every output from PyTorch and fails (exit 2) if any exceeds --tolerance (1e-4 relative). With
--nms it compares the graph's detections with mmdet's ``predict`` and fails if they differ by more than the
bounds of mala_mm.export.DETECTION_BOUNDS; --image checks on a picture with objects in it, not random pixels.
"""
import argparse
import importlib.util
import os
import sys
from typing import List, NoReturn, Optional

import torch
from mmengine.config import DictAction
from torch import nn

from mala_mm.export.onnx_export import DEFAULT_EXPORTER, DEFAULT_OPSET
from mala_tools.config import read_config
from mala_tools.errors import fail, tool_main
from mala_tools.model import build_model

# how the export library's messages name its parameters, and the flags that set them here
FLAGS = {'`shape`': '--shape', '`nms=True`': '--nms', '`backbone_only=True`': '--backbone-only',
         "`exporter='torchscript'`": '--exporter torchscript', '`opset`': '--opset'}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='an mmdet or mmseg config file')
    parser.add_argument('checkpoint', nargs='?', help='the trained weights')
    parser.add_argument('--random-weights', action='store_true',
                        help='without CHECKPOINT: export the weights as the modules construct them, to try the '
                        'export itself (not a model to deploy)')
    parser.add_argument('--out', required=True, help='the .onnx file to write')
    parser.add_argument('--shape', type=int, nargs='+', metavar='N', help='export input H W (default: the '
                        "config's crop_size for segmentors, 800 1344 for detectors)")
    parser.add_argument('--dynamic', action='store_true', help='free batch size, height and width')
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET,
                        help=f'ONNX opset (default {DEFAULT_OPSET}: 18, or where the installed torch\'s TorchScript '
                        'exporter stops below it, its newest)')
    parser.add_argument('--backbone-only', action='store_true', help="export the backbone's feature maps")
    parser.add_argument('--nms', action='store_true', help='detectors: the graph returns the detections of one '
                        'image (boxes, scores, labels, and masks for Mask R-CNN and Cascade), through ONNX\'s '
                        'NonMaxSuppression')
    parser.add_argument('--exporter', choices=['dynamo', 'torchscript'], default=DEFAULT_EXPORTER,
                        help=f"torch.onnx.export's exporter (default here: {DEFAULT_EXPORTER}; dynamo where torch "
                        'has it, from torch 2.5, else torchscript)')
    parser.add_argument('--image', help='check on this picture (at its size, and resized to an unseen size with '
                        '--dynamic), loaded as LoadImageFromFile loads it, instead of on random pixels')
    parser.add_argument('--tolerance', type=float, default=1e-4,
                        help='largest accepted max |onnx - torch| / max |torch| of any output')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.backbone.arch=small')
    return parser.parse_args()


def default_shape(cfg, kind):
    crop = cfg.get('crop_size')
    if kind == 'segmentor' and crop:
        return list(crop)
    return [800, 1344]


def unseen_shape(height, width):
    """A size the export did not see and that is not a multiple of 32."""
    return height + 37, max(32, width - 21)


def read_image(path: str) -> torch.Tensor:
    """``path`` as LoadImageFromFile loads it (BGR), as a (1, 3, H, W) float32 batch."""
    import cv2
    image = cv2.imread(path, cv2.IMREAD_COLOR) if os.path.isfile(path) else None
    if image is None:
        fail(f'--image {path}: no such file, or not an image OpenCV reads')
    return torch.from_numpy(image).permute(2, 0, 1)[None].float()


def check_images(image: Optional[torch.Tensor], export_size, dynamic: bool, generator) -> List[torch.Tensor]:
    """The (1, 3, H, W) images to compare on: random pixels at the export size, or ``image``; with ``dynamic``
    also either at a size the export never saw."""
    if image is None:
        sizes = [export_size] + ([unseen_shape(*export_size)] if dynamic else [])
        return [torch.rand(1, 3, *size, generator=generator) * 255 for size in sizes]
    if not dynamic:
        return [image]
    return [image, nn.functional.interpolate(image, size=unseen_shape(*image.shape[2:]), mode='bilinear')]


def check_weights_named(checkpoint: Optional[str], random_weights: bool):
    if checkpoint is None and not random_weights:
        fail('no CHECKPOINT: name the trained weights, or pass --random-weights to export the untrained model '
             '(to try the export itself)')
    if checkpoint is not None and random_weights:
        fail(f'CHECKPOINT {checkpoint} and --random-weights: give one of the two')


def check_whole_image_inference(cfg, config: str):
    """Stop where mmseg tests the segmentor window by window: the graph computes the whole image at once, whose
    logits differ from those of mmseg's test, and the check would compare it with the same whole-image inference."""
    test_cfg = cfg.model.get('test_cfg') or {}
    if test_cfg.get('mode') == 'slide':
        fail(f"{config}: model.test_cfg.mode='slide': mmseg tests this segmentor in {test_cfg.get('crop_size')} "
             f"windows at stride {test_cfg.get('stride')}, and the graph computes the whole image at once, whose "
             'logits differ from those of its test; to export and check whole-image inference, add --cfg-options '
             "model.test_cfg.mode=whole (then test that config with mmseg's tools/test.py to know its mIoU)")


def fail_in_flags(err: Exception) -> NoReturn:
    """Stop with the export library's message, its parameters named by the flags that set them."""
    message = str(err)
    for parameter, flag in FLAGS.items():
        message = message.replace(parameter, flag)
    fail(message)


def check_deploy_packages(exporter: str, nms: bool):
    # with --nms the dynamo exporter is refused below, with what to pass instead
    needed = ['onnx', 'onnxruntime'] + (['onnxscript'] if exporter == 'dynamo' and not nms else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing == ['onnxscript'] and sys.version_info < (3, 9):
        fail('--exporter dynamo needs onnxscript, which has no release that imports on Python 3.8: pass --exporter '
             'torchscript')
    if missing:
        fail(f'{", ".join(missing)} not installed; install the deploy extra: pip install -e ".[deploy]"')


def main():
    args = parse_args()
    check_weights_named(args.checkpoint, args.random_weights)
    check_deploy_packages(args.exporter, args.nms)
    from mala_mm.export import ExportError, ImageToTensors, check_shape, compare_in_onnxruntime, export_onnx
    try:
        if args.shape is not None:  # before the model is built: a typo costs no time
            check_shape(args.shape)
    except ExportError as err:
        fail_in_flags(err)
    image = read_image(args.image) if args.image else None
    cfg = read_config(args.config, args.cfg_options)
    if not args.backbone_only:
        check_whole_image_inference(cfg, args.config)
    model = build_model(cfg, args.checkpoint)
    try:
        module = ImageToTensors(model, backbone_only=args.backbone_only, nms=args.nms)
        reference = ImageToTensors(model, backbone_only=args.backbone_only, exportable=False, nms=args.nms)
        height, width = check_shape(args.shape or default_shape(cfg, module.kind))
        generator = torch.Generator().manual_seed(0)
        example = torch.rand(1, 3, height, width, generator=generator) * 255
        names = export_onnx(module, example, args.out, dynamic=args.dynamic, opset=args.opset,
                            exporter=args.exporter)
        print(f'wrote {args.out}: {module.kind}, input image (B, 3, H, W) float32 0-255, '
              f'outputs {", ".join(names)}')
        worst, beyond, detections = 0.0, [], 0
        for image in check_images(image, (height, width), args.dynamic, generator):
            size = f'{image.shape[2]}x{image.shape[3]}'
            for row in compare_in_onnxruntime(reference, args.out, image):
                if 'measure' in row:  # detections, against mmdet's predict
                    detections += row['shape'][0] if row['output'] == 'boxes' else 0
                    print(f'  input {size}  {row["output"]:<7} {str(row["shape"]):<16} {row["measure"]} '
                          f'{row["value"]:.3g} (bound {row["bound"]:g})')
                    if not row['within']:
                        beyond.append(f'{row["output"]} {row["measure"]} {row["value"]:.3g} at {size}')
                    continue
                worst = max(worst, row['max_rel'])
                print(f'  input {size}  {row["output"]:<14} {str(row["shape"]):<22} '
                      f'max abs {row["max_abs"]:.3g}  max rel {row["max_rel"]:.3g}')
    except ExportError as err:
        fail_in_flags(err)
    if beyond:
        fail(f"ONNX Runtime's detections differ from mmdet's beyond the bounds: {'; '.join(beyond)} "
             f'({args.out} is kept for inspection)')
    if args.nms:
        nothing = '; neither found anything' + ('' if args.image else ': --image checks on a picture with objects')
        print("ONNX Runtime's detections match mmdet's predict within the bounds" + ('' if detections else nothing))
        return
    if worst > args.tolerance:
        fail(f'ONNX Runtime differs from PyTorch by {worst:.3g} relative, more than --tolerance {args.tolerance:g} '
             f'({args.out} is kept for inspection)')
    print(f'ONNX Runtime matches PyTorch: largest relative difference {worst:.3g} (tolerance {args.tolerance:g})')


if __name__ == '__main__':
    tool_main(main)
