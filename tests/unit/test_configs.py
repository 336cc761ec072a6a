"""Every COCO / ADE20K config builds through its library's registry and runs; the release recipes hold."""
import importlib
import json
import math
import re
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS, init_default_scope
from torch import nn

from mala_mm import MALA
from mala_mm.sample_inputs import data_samples
from mala_tools import model_zoo
from tests.helpers import BUILTIN_CONFIGS, CONFIG_ROOT, LEAF_CONFIGS, load_config

# the model, the hooks and optim wrapper the configs and tools/train.py --amp name, and checkpoints read as data
MALA_IMPORTS = dict(imports=['mala_mm', 'mala_mm.engine', 'mala_mm.safe_loading'], allow_failed_imports=False)

# variant letter -> (arch, drop path rate) of the released detection and segmentation recipes
VARIANTS = {'t': ('tiny', 0.1), 's': ('small', 0.15), 'b': ('base', 0.4), 'l': ('large', 0.55)}
# building and running base / large models takes well over 10 s each on a small CPU
SLOW_VARIANTS = ('b', 'l')
IMAGE_SIZE = 128


def variant_of(config: str) -> str:
    return re.search(r'_mala_([tsbl])(?:_|\.py)', config).group(1)


def load(config: str) -> Config:
    return load_config(CONFIG_ROOT / config)


def config_params():
    for config in LEAF_CONFIGS:
        marks = [pytest.mark.slow] if variant_of(config) in SLOW_VARIANTS else []
        yield pytest.param(config, marks=marks, id=config)


@pytest.mark.parametrize('config', LEAF_CONFIGS + BUILTIN_CONFIGS)
def test_config_imports_the_model_and_the_engine(config):
    assert load(config).custom_imports == MALA_IMPORTS


@pytest.mark.parametrize('config', ['detection/mask_rcnn_mala_t_builtin.py', 'segmentation/upernet_mala_t.py'])
def test_the_types_a_config_names_resolve_through_its_custom_imports_alone(config):
    """As in mmdet's and mmseg's own tools: a fresh process that imports nothing of this project but what the
    config's custom_imports name finds the backbone, every hook and the CPU mixed-precision optim wrapper."""
    code = f"""
import importlib, json
from mmengine.config import Config
cfg = Config.fromfile({str(CONFIG_ROOT / config)!r})
registry = importlib.import_module(cfg.default_scope + '.registry')
hooks = [hook['type'] for hook in [*cfg.default_hooks.values(), *cfg.get('custom_hooks', [])]]
found = dict(MALA=registry.MODELS.get(cfg.model.backbone.type), CPUAmpOptimWrapper=registry.OPTIM_WRAPPERS.get(
    'CPUAmpOptimWrapper'), **{{hook: registry.HOOKS.get(hook) for hook in hooks}})
print(json.dumps(dict(hooks=hooks, missing=[name for name, cls in found.items() if cls is None])))
"""
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {'AtomicCheckpointHook', 'IterationSeedHook', 'SyncNormStatsHook', 'SkippedStepsHook'} <= set(
        report['hooks'])
    assert report['missing'] == []


def test_every_paper_row_has_a_config():
    expected = ([f'detection/mask_rcnn_mala_{v}.py' for v in 'tsbl']
                + [f'detection/{m}_mala_{v}_3x.py' for m in ('mask_rcnn', 'cascade_mask_rcnn') for v in 'sbl']
                + [f'detection/retinanet_mala_{v}.py' for v in 'tsbl']
                + [f'segmentation/{m}_mala_{v}.py' for m in ('upernet', 'fpn') for v in 'tsbl'])
    assert sorted(expected) == LEAF_CONFIGS


def _flat_tensors(outputs):
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for item in outputs for t in _flat_tensors(item)]


# the model-zoo entry of each paper config, by its path relative to CONFIG_ROOT
ZOO_ENTRIES = {entry['Config'].split('configs/', 1)[1]: entry
               for metafile in model_zoo.load_metafiles(CONFIG_ROOT.parent / 'model-index.yml')
               for entry in metafile['Models']}


@pytest.fixture(scope='module', params=list(config_params()))
def paper_model(request):
    """A paper config, loaded, and its model as its library's registry builds it: built once for the tests of that
    config (pytest runs them one after the other), in eval mode."""
    config = request.param
    cfg = load(config)
    if 'rpn' in cfg.model.get('test_cfg', {}):
        # the RoI heads' cost grows with the number of proposals (Cascade runs its mask heads on all of them)
        cfg.model.test_cfg.rpn.max_per_img = 20
    scope = cfg.default_scope
    init_default_scope(scope)
    return config, cfg, importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model).eval()


def test_config_builds_and_runs_in_tensor_mode_with_the_zoos_parameter_count(paper_model, record_property):
    config, cfg, model = paper_model
    scope = cfg.default_scope
    num_params = sum(p.numel() for p in model.parameters())
    record_property('params', num_params)
    print(f'\n{config}: {num_params / 1e6:.2f} M parameters')
    assert ZOO_ENTRIES[config]['Metadata']['Parameters (M)'] == round(num_params / 1e6, 2)

    arch, _ = VARIANTS[variant_of(config)]
    assert isinstance(model.backbone, MALA)
    assert model.backbone.embed_dims == MALA.arch_zoo[arch]['embed_dims']
    assert isinstance(model.backbone.patch_embed.proj[1], nn.SyncBatchNorm)

    inputs = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE)

    features = []
    feature_source = model.neck if scope == 'mmdet' else model.backbone
    hook = feature_source.register_forward_hook(lambda module, args, out: features.extend(out))
    try:
        with torch.no_grad():
            outputs = model(inputs, data_samples(scope, IMAGE_SIZE, IMAGE_SIZE), mode='tensor')
    finally:
        hook.remove()

    tensors = _flat_tensors(outputs)
    assert tensors and all(torch.isfinite(t).all() for t in tensors)
    if scope == 'mmdet':
        # five FPN levels of 256 channels, halving from stride 4 (Mask R-CNN) or 8 (RetinaNet: stages 2-4)
        first_stride = 4 * 2**(cfg.model.backbone.out_indices[0] + cfg.model.neck.get('start_level', 0))
        assert [tuple(f.shape) for f in features] == [
            (1, 256, math.ceil(IMAGE_SIZE / (first_stride * 2**i)), math.ceil(IMAGE_SIZE / (first_stride * 2**i)))
            for i in range(5)]
    else:
        assert [f.shape[1] for f in features] == MALA.arch_zoo[arch]['embed_dims']
        assert outputs.shape == (1, 150, IMAGE_SIZE // 4, IMAGE_SIZE // 4)


# ----------------------------------------------------------------------------------------------------------
# the release's training recipes

DETECTION_CONFIGS = [c for c in LEAF_CONFIGS if c.startswith('detection/')]
SEGMENTATION_CONFIGS = [c for c in LEAF_CONFIGS if c.startswith('segmentation/')]


@pytest.mark.parametrize('config', LEAF_CONFIGS)
def test_backbone_settings(config):
    cfg = load(config)
    v = variant_of(config)
    arch, drop_path = VARIANTS[v]
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch) == ('MALA', arch)
    assert backbone.get('drop_path_rate', MALA.arch_zoo[arch]['drop_path_rate']) == drop_path
    assert backbone.norm_cfg == dict(type='SyncBN', requires_grad=True) and backbone.norm_eval is False
    assert cfg.pretrained == f'checkpoints/mala_{v}_in1k.pth'
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained)
    widths = MALA.arch_zoo[arch]['embed_dims']
    if 'retinanet' in config:
        assert cfg.model.neck.in_channels == widths[1:]
    elif config.startswith('detection/') or '/fpn_' in config:
        assert cfg.model.neck.in_channels == widths
    else:
        assert cfg.model.decode_head.in_channels == widths
        assert cfg.model.auxiliary_head.in_channels == widths[2]


@pytest.mark.parametrize('config', DETECTION_CONFIGS)
def test_detection_recipe(config):
    cfg = load(config)
    three_x = config.endswith('_3x.py')
    large_3x = three_x and variant_of(config) == 'l'
    retinanet = 'retinanet' in config

    optim = cfg.optim_wrapper
    assert optim.optimizer == dict(type='AdamW', lr=2e-4 if large_3x else 4e-4, betas=(0.9, 0.999),
                                   weight_decay=1e-4 if retinanet else 0.05)
    warmup, steps = cfg.param_scheduler
    assert warmup == dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500)
    assert cfg.train_cfg.max_epochs == (36 if three_x else 12)
    assert (steps.type, steps.milestones, steps.gamma, steps.end) == (
        'MultiStepLR', [27, 33] if three_x else [8, 11], 0.1, cfg.train_cfg.max_epochs)
    assert cfg.train_dataloader.batch_size == (1 if large_3x else 2)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=8 if large_3x else 16)
    assert cfg.train_dataloader.dataset.data_root == 'data/coco/'

    transforms = [t.type for t in cfg.train_dataloader.dataset.pipeline]
    if three_x:
        choice = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomChoice')
        short_sides = [(s, 1333) for s in range(480, 801, 32)]
        assert choice.transforms[0][0].scales == short_sides
        assert [t.type for t in choice.transforms[1]] == ['RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
        assert choice.transforms[1][0].scales == [(400, 1333), (500, 1333), (600, 1333)]
        assert choice.transforms[1][1].crop_size == (384, 600)
        assert choice.transforms[1][2].scales == short_sides
    else:
        resize = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'Resize')
        assert resize.scale == (1333, 800) and 'RandomChoice' not in transforms
    flip = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomFlip')
    assert flip.prob == 0.5


@pytest.mark.parametrize('variant', 'sbl')
def test_cascade_heads(variant):
    heads = load(f'detection/cascade_mask_rcnn_mala_{variant}_3x.py').model.roi_head.bbox_head
    assert len(heads) == 3
    assert [h.bbox_coder.target_stds for h in heads] == [
        [0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067]]
    for head in heads:
        assert head.type == 'Shared4Conv1FCBBoxHead'
        assert head.norm_cfg == dict(type='SyncBN', requires_grad=True)
        assert head.reg_decoded_bbox is True
        assert head.loss_bbox == dict(type='GIoULoss', loss_weight=10.0)


@pytest.mark.parametrize('variant', 'tsbl')
def test_retinanet_fpn_from_stage_2(variant):
    cfg = load(f'detection/retinanet_mala_{variant}.py')
    assert (cfg.model.neck.start_level, cfg.model.neck.add_extra_convs, cfg.model.neck.num_outs) == (
        0, 'on_input', 5)
    assert cfg.model.backbone.out_indices == (1, 2, 3)
    assert 'find_unused_parameters' not in cfg


def test_retinanet_trains_every_parameter():
    """With stages 2-4 as the backbone's outputs, every parameter gets a gradient: DDP needs no unused-parameter
    search (the release's four outputs with FPN start_level=1 left stage 1's output norm unused)."""
    cfg = load('detection/retinanet_mala_t.py')
    cfg.model.backbone.norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN needs a process group
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    from mmengine.structures import InstanceData
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).train()
    samples = data_samples('mmdet', IMAGE_SIZE, IMAGE_SIZE)
    samples[0].gt_instances = InstanceData(bboxes=torch.tensor([[16., 16., 80., 96.]]), labels=torch.tensor([1]))
    losses = model.loss(torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE), samples)
    sum(value.sum() if isinstance(value, torch.Tensor) else sum(value) for value in losses.values()).backward()
    without_grad = [name for name, p in model.named_parameters() if p.grad is None]
    assert without_grad == []


@pytest.mark.parametrize('config', SEGMENTATION_CONFIGS)
def test_segmentation_recipe(config):
    cfg = load(config)
    upernet = '/upernet_' in config
    large = variant_of(config) == 'l'
    iters = 160000 if upernet else 80000

    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=6e-5 if upernet else 1e-4, betas=(0.9, 0.999),
                                               weight_decay=0.01 if upernet else 1e-4)
    assert cfg.train_cfg.max_iters == iters
    poly = cfg.param_scheduler[-1]
    assert (poly.type, poly.power, poly.eta_min, poly.begin, poly.end) == (
        'PolyLR', 1.0 if upernet else 0.9, 0.0 if upernet else 1e-6, 0, iters)
    if upernet:
        assert cfg.param_scheduler[0] == dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500)
        assert cfg.model.decode_head.channels == 512
        aux = cfg.model.auxiliary_head
        assert (aux.type, aux.in_index, aux.loss_decode.loss_weight) == ('FCNHead', 2, 0.4)
    else:
        assert len(cfg.param_scheduler) == 1
        assert (cfg.model.neck.out_channels, cfg.model.decode_head.channels) == (256, 128)
    assert cfg.model.decode_head.num_classes == 150
    # only the UperNet MALA-L uses 1 image per GPU; the release's FPN_l_1x.py keeps samples_per_gpu=2
    one_per_gpu = large and upernet
    assert cfg.train_dataloader.batch_size == (1 if one_per_gpu else 2)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=8 if one_per_gpu else 16)
    assert cfg.train_dataloader.dataset.data_root == 'data/ade/ADEChallengeData2016'
    crop = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomCrop')
    assert crop.crop_size == (512, 512) and cfg.model.data_preprocessor.size == (512, 512)
    assert [t.type for t in cfg.test_dataloader.dataset.pipeline if t.type in ('Resize', 'TestTimeAug')] == ['Resize']


def test_upernet_lr_curve_matches_warmup_times_poly():
    """The release's mmcv poly policy multiplied the poly lr by the warm-up factor; the chained schedulers do.

    (mmengine schedulers reach their end value at ``end - 1``.)
    """
    cfg = load('segmentation/upernet_mala_t.py')
    base_lr = cfg.optim_wrapper.optimizer.lr
    optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=base_lr)
    schedulers = [PARAM_SCHEDULERS.build(dict(s, optimizer=optimizer)) for s in cfg.param_scheduler]
    expected = {}
    for it in range(3001):
        if it in (0, 750, 1500, 3000):
            warmup = 1e-6 + (1 - 1e-6) * min(it, 1499) / 1499
            expected[it] = (optimizer.param_groups[0]['lr'], base_lr * warmup * (1 - it / 159999))
        for scheduler in schedulers:
            scheduler.step()
    for it, (lr, want) in expected.items():
        assert lr == pytest.approx(want, rel=1e-6), it


# ----------------------------------------------------------------------------------------------------------
# what the release's optimizer did to each parameter, its precision and its evaluation cadence, per method

NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.GroupNorm, nn.LayerNorm)


def method_of(config: str) -> str:
    return re.match(r'\w+/(\w+?)_mala_', config).group(1)


def release_is_decayed(method: str, name: str, module: nn.Module) -> bool:
    """Whether the release's recipe for ``method`` decayed the parameter ``name`` of ``module``, in the words of
    its paramwise_cfgs: Mask R-CNN and UperNet exempt a parameter whose name holds 'norm'; Cascade Mask R-CNN also
    every norm layer; RetinaNet and Semantic FPN exempt nothing."""
    if method in ('retinanet', 'fpn'):
        return True
    if method in ('mask_rcnn', 'upernet'):
        return 'norm' not in name
    assert method == 'cascade_mask_rcnn', method
    return 'norm' not in name and not isinstance(module, NORM_LAYERS)


def test_each_parameter_gets_the_release_weight_decay_and_lr(paper_model):
    config, cfg, model = paper_model
    # mmengine's AmpOptimWrapper refuses to be built without an accelerator; the parameter groups come from the
    # constructor alone, whatever the wrapper
    plain = {key: value for key, value in cfg.optim_wrapper.items() if key != 'loss_scale'}
    groups = build_optim_wrapper(model, dict(plain, type='OptimWrapper')).optimizer.param_groups
    given = {id(p): (group['weight_decay'], group['lr']) for group in groups for p in group['params']}
    base_wd, base_lr = cfg.optim_wrapper.optimizer.weight_decay, cfg.optim_wrapper.optimizer.lr
    method = method_of(config)
    wrong, exempt = [], 0
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            name = f'{module_name}.{param_name}'
            want = (base_wd if release_is_decayed(method, name, module) else 0., base_lr)
            exempt += want[0] == 0
            if given[id(param)] != want:
                wrong.append(f'{name}: weight decay, lr {given[id(param)]}, the release {want}')
    assert len(given) == sum(1 for _ in model.parameters())
    assert not wrong, f'{len(wrong)} parameters differ from the release, e.g. {wrong[:5]}'
    assert (exempt == 0) == (method in ('retinanet', 'fpn'))


@pytest.mark.parametrize('config', LEAF_CONFIGS)
def test_precision_and_evaluation_cadence_are_the_releases(config):
    """fp16 with mmcv 1.x's static loss scale 512 for every detector and UperNet, fp32 for Semantic FPN; every
    detector evaluates and saves each epoch, UperNet every 8,000 iterations keeping the best mIoU, Semantic FPN
    every 4,000."""
    cfg = load(config)
    method = method_of(config)
    if method == 'fpn':
        assert cfg.optim_wrapper.type == 'OptimWrapper' and 'loss_scale' not in cfg.optim_wrapper
    else:
        assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
        assert cfg.optim_wrapper.loss_scale == 512. and cfg.optim_wrapper.get('dtype') in (None, 'float16')
    assert 'clip_grad' not in cfg.optim_wrapper
    checkpoint = cfg.default_hooks.checkpoint
    if config.startswith('detection/'):
        assert (cfg.train_cfg.type, cfg.train_cfg.val_interval) == ('EpochBasedTrainLoop', 1)
        assert (checkpoint.interval, checkpoint.get('by_epoch', True), checkpoint.get('save_best')) == (1, True, None)
    else:
        interval = 8000 if method == 'upernet' else 4000
        assert (cfg.train_cfg.type, cfg.train_cfg.val_interval) == ('IterBasedTrainLoop', interval)
        assert (checkpoint.interval, checkpoint.by_epoch) == (interval, False)
        assert checkpoint.get('save_best') == ('mIoU' if method == 'upernet' else None)
    # the last few, not every one: a 160k UperNet-B run kept 20 checkpoints of 887 MiB
    assert checkpoint.max_keep_ckpts == 3
