"""Draw a model's predictions on one image: boxes and masks (mmdet config) or a label map (mmseg config).

    python tools/demo.py IMAGE CONFIG CHECKPOINT --out FILE [--score-thr 0.3] [--device cpu]
"""
import argparse
import os
import os.path as osp

import mmcv
import torch
from mmengine.config import Config

from runner_utils import SCOPES, fail


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help='image file')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='picture to write (.png or .jpg)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection: lowest score drawn')
    parser.add_argument('--opacity', type=float, default=0.5, help='segmentation: opacity of the label map')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    return parser.parse_args()


def predict_and_draw(scope, args, image):
    if scope == 'mmdet':
        from mmdet.apis import inference_detector, init_detector
        from mmdet.registry import VISUALIZERS
        model = init_detector(args.config, args.checkpoint, device=args.device)
        result = inference_detector(model, args.image)
        draw_args = dict(pred_score_thr=args.score_thr)
    else:
        from mmseg.apis import inference_model, init_model
        from mmseg.registry import VISUALIZERS
        model = init_model(args.config, args.checkpoint, device=args.device)
        result = inference_model(model, args.image)
        draw_args = dict(with_labels=True)
        model.cfg.visualizer.alpha = args.opacity
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    visualizer.add_datasample('prediction', image, data_sample=result, draw_gt=False, show=False,
                              out_file=args.out, **draw_args)
    return result


def main():
    args = parse_args()
    for path, what in ((args.image, 'image'), (args.config, 'config file'), (args.checkpoint, 'checkpoint')):
        if not osp.isfile(path):
            fail(f'{what} {path!r} does not exist')
    scope = Config.fromfile(args.config).get('default_scope')
    if scope not in SCOPES:
        fail(f'{args.config}: default_scope must be one of {SCOPES}, got {scope!r}')
    from mala_mm.checkpoint import SAFE_GLOBALS
    torch.serialization.add_safe_globals(SAFE_GLOBALS)  # checkpoints written by mmengine carry a few classes
    image = mmcv.imread(args.image, channel_order='rgb')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    result = predict_and_draw(scope, args, image)
    if scope == 'mmdet':
        kept = result.pred_instances[result.pred_instances.scores >= args.score_thr]
        summary = f'{len(kept)} objects with score >= {args.score_thr}'
    else:
        summary = f'classes present: {sorted(result.pred_sem_seg.data.unique().tolist())}'
    print(f'wrote {args.out}: {summary}')


if __name__ == '__main__':
    main()
