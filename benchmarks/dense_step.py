"""One whole detector and segmentor step: Mask R-CNN at 1333x800 and UperNet at 512x512, MALA-T against Swin-T.

Times a training step (loss forward + backward) and an inference step of the models the repository's configs
build, with this backbone, with the explicit reference backbone of ``mala_tools.reference`` (same weights; MALA in
the release's linear order, softmax through its N x N matrix), and of mmdet's and mmseg's own Swin-T configs of the
same models: what a user who picks MALA-T over Swin-T gets per iteration. Writes results/<device>/dense_step.{md,json}.

    python -m benchmarks.dense_step [--device cpu]
"""
import argparse
import os

import torch
from mmengine.hub import get_config

from mala_mm.sample_inputs import data_samples
from mala_tools.config import read_config
from mala_tools.model import build_model
from mala_tools.reference import reference_backbone

from .common import markdown_table, peak_mib, time_ms, write_results

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
# per model: our config, the library's own Swin-T config of it, the input (height, width)
CASES = {
    'Mask R-CNN': ('detection/mask_rcnn_mala_t.py', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', (800, 1333)),
    'UperNet': ('segmentation/upernet_mala_t.py',
                'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py', (512, 512)),
}


def build(config_path, backbone=None):
    """The config's scope and model, with the release's random initialisation (no ImageNet file needed).
    ``config_path``: under configs/, or a library's own (``mmdet::...``); ``backbone``: arguments to override."""
    cfg = get_config(config_path) if '::' in config_path else read_config(os.path.join(CONFIGS, config_path))
    if backbone:
        cfg.model.backbone.update(backbone)
    model = build_model(cfg)
    model.init_weights()
    return cfg.default_scope, model


def fake_batch(scope, size, device, images=None):
    """``images`` images (default: one, two for the segmentor: its pooling module's BN needs a batch), each the
    first one or its mirror image with three objects, in the data-sample format of each library."""
    h, w = size
    images = images or (1 if scope == 'mmdet' else 2)
    image = torch.rand(3, h, w, device=device) * 255
    boxes = torch.tensor([[.03, .08, .22, .5], [.38, .12, .68, .88], [.75, .38, .98, .97]]) * torch.tensor([w, h, w, h])
    masks = torch.zeros(len(boxes), h, w, dtype=torch.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
        masks[i, y1:y2, x1:x2] = 1
    mirrored = [i % 2 == 1 for i in range(images)]
    inputs = [image.flip(-1) if flip else image for flip in mirrored]
    samples = data_samples(scope, h, w, images)
    for sample, flip in zip(samples, mirrored):
        sample_masks = masks.flip(-1) if flip else masks
        if scope == 'mmdet':
            from mmdet.structures.mask import BitmapMasks
            from mmengine.structures import InstanceData
            sample_boxes = boxes[:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor([w, 0, w, 0]) \
                if flip else boxes
            sample.gt_instances = InstanceData(bboxes=sample_boxes.to(device),
                                               labels=torch.tensor([0, 1, 2], device=device),
                                               masks=BitmapMasks(sample_masks.numpy(), h, w))
        else:
            from mmengine.structures import PixelData
            sample.gt_sem_seg = PixelData(data=(sample_masks.argmax(0, keepdim=True) * 7).long().to(device))
    return dict(inputs=inputs, data_samples=samples)


def measure(model, batch, device) -> dict:
    """Train and predict step times (ms) and peak memory (MiB) of ``model`` on ``batch``."""
    def train_step():
        model.train()
        loss, _ = model.parse_losses(model(**model.data_preprocessor(batch, True), mode='loss'))
        loss.backward()

    def predict_step():
        model.eval()
        with torch.no_grad():
            model(**model.data_preprocessor(batch, False), mode='predict')
    return {'train step ms': time_ms(train_step, device, warmup=1, repeats=3),
            'train MiB': peak_mib(train_step, device),
            'predict ms': time_ms(predict_step, device, warmup=1, repeats=3),
            'predict MiB': peak_mib(predict_step, device)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for name, (config_path, swin_config, size) in CASES.items():
        scope, model = build(config_path)
        model = model.to(device)
        batch = fake_batch(scope, size, device)
        measured = {'MALA-T': measure(model, batch, device)}
        model.backbone = reference_backbone(model.backbone, mala_order='release')
        measured['MALA-T reference'] = measure(model, batch, device)
        measured['Swin-T'] = measure(build(swin_config)[1].to(device), batch, device)
        for backbone, row in measured.items():
            rows.append(dict(model=name, input=f'{size[1]}x{size[0]}', backbone=backbone, **row,
                             **{f'{step} speed vs Swin-T': measured['Swin-T'][f'{step} ms'] / row[f'{step} ms']
                                for step in ('train step', 'predict')}))
            print(rows[-1], flush=True)
    table = markdown_table(rows, ['model', 'input', 'backbone', 'train step ms', 'train MiB', 'predict ms',
                                  'predict MiB', 'train step speed vs Swin-T', 'predict speed vs Swin-T'])
    print(table)
    print(f"written to {write_results('dense_step', device, rows, table)}")


if __name__ == '__main__':
    main()
