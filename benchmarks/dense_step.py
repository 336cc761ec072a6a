"""One whole detector and segmentor step: Mask R-CNN MALA-T at 1333x800 and UperNet MALA-T at 512x512.

Times a training step (loss forward + backward) and an inference step of the models the repository's configs
build, with this backbone and with the explicit reference backbone of ``mala_tools.reference`` as baseline (same
weights; MALA in the release's linear order, softmax through its N x N matrix), and writes
results/<device>/dense_step.{md,json}.

    python benchmarks/dense_step.py [--device cpu]
"""
import argparse
import os

import torch

from common import markdown_table, peak_mib, time_ms, write_results
from mala_tools.config import read_config
from mala_tools.model import build_model
from mala_tools.reference import reference_backbone
from mala_mm.sample_inputs import data_samples

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
CASES = {
    'Mask R-CNN MALA-T': ('detection/mask_rcnn_mala_t.py', (800, 1333)),
    'UperNet MALA-T': ('segmentation/upernet_mala_t.py', (512, 512)),
}


def build(config_path):
    """The config's scope and model, with the release's random initialisation (no ImageNet file needed)."""
    cfg = read_config(os.path.join(CONFIGS, config_path))
    model = build_model(cfg)
    model.init_weights()
    return cfg.default_scope, model


def fake_batch(scope, size, device):
    """One image with three objects (two for the segmentor: its pooling module's BN needs a batch), in the
    data-sample format of each library."""
    h, w = size
    image = torch.rand(3, h, w, device=device) * 255
    boxes = torch.tensor([[.03, .08, .22, .5], [.38, .12, .68, .88], [.75, .38, .98, .97]]) * torch.tensor([w, h, w, h])
    masks = torch.zeros(len(boxes), h, w, dtype=torch.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
        masks[i, y1:y2, x1:x2] = 1
    sample = data_samples(scope, h, w)[0]
    if scope == 'mmdet':
        from mmdet.structures.mask import BitmapMasks
        from mmengine.structures import InstanceData
        sample.gt_instances = InstanceData(bboxes=boxes.to(device), labels=torch.tensor([0, 1, 2], device=device),
                                           masks=BitmapMasks(masks.numpy(), h, w))
    else:
        from mmengine.structures import PixelData
        sample.gt_sem_seg = PixelData(data=(masks.argmax(0, keepdim=True) * 7).long().to(device))
        return dict(inputs=[image, image.flip(-1)], data_samples=[sample, sample])
    return dict(inputs=[image], data_samples=[sample])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for name, (config_path, size) in CASES.items():
        scope, model = build(config_path)
        model = model.to(device)
        batch = fake_batch(scope, size, device)
        for backbone_name in ('ours', 'baseline'):
            if backbone_name == 'baseline':
                model.backbone = reference_backbone(model.backbone, mala_order='release')

            def train_step():
                model.train()
                loss, _ = model.parse_losses(model(**model.data_preprocessor(batch, True), mode='loss'))
                loss.backward()

            def predict_step():
                model.eval()
                with torch.no_grad():
                    model(**model.data_preprocessor(batch, False), mode='predict')

            row = dict(model=name, input=f'{size[1]}x{size[0]}', backbone=backbone_name)
            row['train step ms'] = time_ms(train_step, device, warmup=1, repeats=3)
            row['train MiB'] = peak_mib(train_step, device)
            row['predict ms'] = time_ms(predict_step, device, warmup=1, repeats=3)
            row['predict MiB'] = peak_mib(predict_step, device)
            rows.append(row)
            print(row, flush=True)
    table = markdown_table(rows, ['model', 'input', 'backbone', 'train step ms', 'train MiB', 'predict ms',
                                  'predict MiB'])
    print(table)
    print(f"written to {write_results('dense_step', device, rows, table)}")


if __name__ == '__main__':
    main()
