"""Draw a model's predictions on one image: boxes and masks (mmdet config) or a label map (mmseg config).

    python tools/demo.py IMAGE CONFIG CHECKPOINT --out FILE [--score-thr 0.3] [--scale 4] [--with-gt]

--with-gt draws the image's annotation from the config's test dataset on the left and the prediction on the
right. --scale enlarges the picture (nearest-neighbour masks, scaled boxes) so that small images stay readable.
"""
import argparse
import os
import os.path as osp

import mmcv
import torch
import torch.nn.functional as F
from mmengine.structures import PixelData

from mala_tools.config import read_config
from mala_tools.errors import fail, require_file, tool_main
from mala_tools.model import build_model


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help='image file')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='picture to write (.png or .jpg)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection: lowest score drawn')
    parser.add_argument('--opacity', type=float, default=0.5, help='segmentation: opacity of the label map')
    parser.add_argument('--scale', type=int, default=1, help='enlarge the picture this many times')
    parser.add_argument('--with-gt', action='store_true',
                        help="draw the image's annotation from the config's test dataset beside the prediction")
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    return parser.parse_args()


def ground_truth(cfg, image_path):
    """The test dataset's sample of ``image_path`` after its pipeline (annotations included)."""
    from mmengine.registry import DATASETS, init_default_scope
    init_default_scope(cfg.default_scope)
    dataset = DATASETS.build(cfg.test_dataloader.dataset)
    name = osp.basename(image_path)
    for index in range(len(dataset)):
        if osp.basename(dataset.get_data_info(index)['img_path']) == name:
            return dataset[index]['data_samples']
    fail(f'--with-gt: {name} is not in the test dataset of the config')


def enlarge(sample, factor: int):
    """The data sample with its boxes, masks and label maps ``factor`` times larger."""
    if factor == 1:
        return sample
    for key in ('gt_instances', 'pred_instances'):
        if key not in sample:
            continue
        instances = sample.get(key)
        if 'bboxes' in instances:
            boxes = instances.bboxes
            instances.bboxes = boxes.tensor * factor if hasattr(boxes, 'tensor') else boxes * factor
        if 'masks' in instances:
            masks = instances.masks
            if hasattr(masks, 'to_tensor'):  # BitmapMasks / PolygonMasks of an annotation
                masks = masks.to_tensor(torch.uint8, 'cpu')
            if len(masks):
                masks = F.interpolate(masks[:, None].float(), scale_factor=factor, mode='nearest')[:, 0].bool()
            instances.masks = masks
    for key in ('gt_sem_seg', 'pred_sem_seg'):
        if key in sample:  # a new PixelData: its shape is fixed once set
            labels = F.interpolate(sample.get(key).data[None].float(), scale_factor=factor, mode='nearest')
            sample.set_field(PixelData(data=labels[0].long()), key)
    sample.set_metainfo(dict(img_shape=tuple(s * factor for s in sample.img_shape)))
    return sample


def predict(scope, model, image_path):
    """The model's prediction on the image, through the test pipeline of ``model.cfg``."""
    if scope == 'mmdet':
        from mmdet.apis import inference_detector
        return inference_detector(model, image_path)
    from mmseg.apis import inference_model
    return inference_model(model, image_path)


def draw(scope, model, sample, image, args):
    registry = __import__(f'{scope}.registry', fromlist=['VISUALIZERS'])
    if scope == 'mmseg':
        model.cfg.visualizer.alpha = args.opacity
    visualizer = registry.VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    draw_args = dict(pred_score_thr=args.score_thr) if scope == 'mmdet' else dict(with_labels=True)
    visualizer.add_datasample('prediction', image, data_sample=sample, draw_gt=args.with_gt, show=False,
                              out_file=args.out, **draw_args)


def main():
    args = parse_args()
    require_file(args.image, 'image')
    if args.scale < 1:
        fail(f'--scale must be a positive whole number, got {args.scale}')
    cfg = read_config(args.config)
    model = build_model(cfg, args.checkpoint, args.device)
    scope = cfg.default_scope
    image = mmcv.imread(args.image, channel_order='rgb')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    result = predict(scope, model, args.image)
    classes = model.dataset_meta.get('classes')
    if classes is None:
        fail(f'no class names: {args.checkpoint} holds no dataset_meta and {args.config} no test dataset')
    if scope == 'mmdet':
        kept = result.pred_instances[result.pred_instances.scores >= args.score_thr]
        summary = f'{len(kept)} objects with score >= {args.score_thr}: ' + ', '.join(
            f'{classes[label]} {score:.2f}' for label, score in zip(kept.labels.tolist(), kept.scores.tolist()))
    else:
        summary = 'classes present: ' + ', '.join(classes[i] for i in result.pred_sem_seg.data.unique().tolist())
    if args.with_gt:
        annotation = ground_truth(cfg, args.image)
        for key in ('gt_instances', 'gt_sem_seg'):
            if key in annotation:
                result.set_field(annotation.get(key), key)
    image = mmcv.imrescale(image, args.scale, interpolation='nearest') if args.scale > 1 else image
    draw(scope, model, enlarge(result, args.scale), image, args)
    print(f'wrote {args.out}: {summary}')


if __name__ == '__main__':
    tool_main(main)
