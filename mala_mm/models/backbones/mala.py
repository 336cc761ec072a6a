"""MALA (MAViT) backbone for dense prediction."""
from typing import Dict, List, Optional, Sequence, Union

import torch
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.utils import deprecated_api_warning
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...checkpoint import load_backbone_weights
from ...ops.dispatch import check_impl
from ...ops.runtime import BlockRuntime
from ..layers import ConvStem, LayerNorm2d, MALAStage
from .mala_arguments import (MALAConfigError, check_compile, check_stages, resolve_arch, resolve_attn_types,
                             resolve_init_cfg)


# in mmengine's root registry, which mmdet's and mmseg's MODELS consult for a type they do not hold themselves
@MODELS.register_module()
class MALA(BaseModule):
    """MALA backbone from "Rectifying Magnitude Neglect in Linear Attention" (ICCV 2025).

    A conv stem (stride 4) and four stages of pre-norm blocks whose token mixer is magnitude-aware linear
    attention or softmax attention; returns the normalised output of each stage in ``out_indices``
    (strides 4, 8, 16, 32). Parameter names match the released checkpoints.

    Args:
        arch: 'tiny', 'small', 'base', 'large' (or 't', 's', 'b', 'l'), or a dict with ``embed_dims``,
            ``depths``, ``num_heads`` (one entry per stage) and optionally ``mlp_ratio`` (3.5),
            ``layer_scale_init`` (1.0; a number or one per stage; None disables layer scale) and
            ``drop_path_rate`` (0.1).
        attn_types: the token mixer of each stage, 'mala' or 'softmax'; one string applies to every stage.
            The released models use ('mala', 'mala', 'softmax', 'softmax').
        in_channels: input image channels.
        drop_path_rate: stochastic depth, rising linearly to this over all blocks; None takes the arch's.
        out_indices: stages whose outputs are returned.
        frozen_stages: freeze the stem (0) and also the first ``frozen_stages`` stages (>= 1); -1 freezes
            nothing.
        norm_eval: keep every BatchNorm (SyncBN included) in eval mode while training.
        norm_cfg: norm of the stem and downsamples, e.g. dict(type='BN') or dict(type='SyncBN').
        with_cp: activation checkpointing in every block.
        compile: run each block through ``torch.compile`` (torch >= 2.4) with ``fullgraph=True, dynamic=True``,
            the stem, downsamples and output norms eagerly; True, or a dict of ``torch.compile`` arguments
            (:mod:`mala_mm.ops.runtime`; docs/dev/benchmarks.md says what compiles when).
        impl: how the blocks' operators run (:mod:`mala_mm.ops`): 'triton' in Triton kernels, 'torch' in torch
            operators, or 'auto': Triton's for CUDA tensors on GPUs of compute capability 8.0 and newer where
            Triton is installed, torch's elsewhere. Traced, exported and compiled graphs take torch's. Both load the
            same weights. ``attn_impl`` is its deprecated name.
        pretrained: deprecated, as in mmdet's and mmseg's backbones: a path or URL stands for
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)`` (mmseg's segmentors pass their
            ``model.pretrained`` here); given with ``init_cfg``, an error.
        init_cfg: dict(type='Pretrained', checkpoint=PATH_OR_URL) loads a released classification checkpoint,
            an mmdet/mmseg checkpoint holding ``backbone.*`` or a plain backbone state dict; an optional
            ``prefix`` picks the sub-dict. Without it, weights are initialised as released (truncated normal).
    """

    arch_zoo: Dict[str, dict] = {
        'tiny': dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8],
                     mlp_ratio=3.5, layer_scale_init=[1.0, 1.0, 1.0, 1.0], drop_path_rate=0.1),
        'small': dict(embed_dims=[64, 128, 320, 512], depths=[3, 5, 9, 3], num_heads=[1, 2, 5, 8],
                      mlp_ratio=3.5, layer_scale_init=[1.0, 1.0, 1.0, 1.0], drop_path_rate=0.15),
        'base': dict(embed_dims=[96, 192, 384, 512], depths=[4, 6, 12, 6], num_heads=[1, 2, 6, 8],
                     mlp_ratio=3.5, layer_scale_init=[1.0, 1.0, 1e-6, 1e-6], drop_path_rate=0.4),
        'large': dict(embed_dims=[96, 192, 448, 640], depths=[4, 7, 19, 8], num_heads=[1, 2, 7, 10],
                      mlp_ratio=3.5, layer_scale_init=[1e-6, 1e-6, 1e-6, 1e-6], drop_path_rate=0.55),
    }
    arch_zoo.update({name[0]: spec for name, spec in list(arch_zoo.items())})

    @deprecated_api_warning({'attn_impl': 'impl'}, cls_name='MALA')
    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 attn_types: Union[str, Sequence[str]] = ('mala', 'mala', 'softmax', 'softmax'),
                 in_channels: int = 3,
                 drop_path_rate: Optional[float] = None,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 with_cp: bool = False,
                 compile: Union[bool, dict] = False,
                 impl: str = 'auto',
                 pretrained: Optional[str] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=resolve_init_cfg(init_cfg, pretrained))
        arch = resolve_arch(arch, self.arch_zoo)
        num_stages = len(arch['depths'])
        self.embed_dims = list(arch['embed_dims'])
        self.in_channels = in_channels
        self.attn_types = resolve_attn_types(attn_types, num_stages)
        self.out_indices = tuple(out_indices)
        check_stages(self.out_indices, frozen_stages, num_stages)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        check_impl(impl, 'MALA: ', MALAConfigError)

        self.patch_embed = ConvStem(in_channels, self.embed_dims[0], norm_cfg, impl)
        self.layers = nn.ModuleList(self._stages(arch, drop_path_rate, norm_cfg, impl))
        # keyed by stage index so that the state dict reads extra_norms.{i}.* as released
        self.extra_norms = nn.ModuleDict({str(i): LayerNorm2d(self.embed_dims[i]) for i in self.out_indices})
        # the conv weights channels-last, as the maps are (forward), and so their gradients come
        BlockRuntime.store_channels_last(self)
        # every branch's probability of being kept, stage by stage: training draws all their factors at once
        keep_probs = [p for stage in self.layers for p in stage.keep_probs()]
        self.register_buffer('keep_probs', torch.tensor(keep_probs), persistent=False)
        self._freeze_stages()
        # the kinds of block a compiled function serves: a stage's blocks, and where stochastic depth is on, the first
        # block of the first stage apart from the others (its rate is 0, so it has no DropPath)
        self.runtime = BlockRuntime([2 * len(stage.blocks) for stage in self.layers], min(keep_probs) < 1,
                                    self._conv_parameters, check_compile(compile), block_kinds=num_stages + 1,
                                    weight_copies=not with_cp)

    def _stages(self, arch: dict, drop_path_rate: Optional[float], norm_cfg: dict, impl: str) -> List[MALAStage]:
        """The stages of ``arch``, stochastic depth rising linearly over all blocks to ``drop_path_rate``."""
        depths, num_stages = arch['depths'], len(arch['depths'])
        # on the CPU whatever device the model is built on: Python floats, also for a build on the meta device
        rates = torch.linspace(0, arch['drop_path_rate'] if drop_path_rate is None else drop_path_rate,
                               sum(depths), device='cpu').tolist()
        layer_scale = arch['layer_scale_init']
        if layer_scale is None or isinstance(layer_scale, (int, float)):
            layer_scale = [layer_scale] * num_stages
        return [MALAStage(embed_dims=self.embed_dims[i], num_heads=arch['num_heads'][i], attn_type=self.attn_types[i],
                          mlp_ratio=arch['mlp_ratio'], drop_paths=rates[sum(depths[:i]):sum(depths[:i + 1])],
                          layer_scale_init=layer_scale[i],
                          out_dims=self.embed_dims[i + 1] if i + 1 < num_stages else None, norm_cfg=norm_cfg,
                          with_cp=self.with_cp, impl=impl)
                for i in range(num_stages)]

    def init_weights(self):
        """Load ``init_cfg``'s checkpoint if it names one, else initialise as the release does."""
        if self.init_cfg is not None:
            cfg = dict(self.init_cfg)
            load_backbone_weights(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                  logger=MMLogger.get_current_instance())
        else:
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, (nn.LayerNorm, _BatchNorm)):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
        self.is_init = True

    def forward(self, x: Tensor) -> tuple:
        """x: (B, in_channels, H, W), any H, W >= 1. Returns, per out index i, a contiguous
        (B, C_i, ceil(H/s_i), ceil(W/s_i)) map with s_i = 4, 8, 16, 32."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'MALA expects a (B, {self.in_channels}, H, W) batch, got shape {tuple(x.shape)}')
        if x.shape[-1] == 0 or x.shape[-2] == 0:
            raise ValueError(f'MALA got an empty image batch of shape {tuple(x.shape)}; H and W must be >= 1')
        with self.runtime.run(x, self.keep_probs if self.training else None) as calls:
            # channels-last throughout: depth-wise convs run about 3x faster on it than on NCHW, and elementwise ops
            # between maps of one layout several times faster than across layouts
            x = self.patch_embed(x.contiguous(memory_format=torch.channels_last))
            outs = []
            for i, stage in enumerate(self.layers):
                out_norm = self.extra_norms[str(i)] if i in self.out_indices else None
                out, x = stage(x, calls.drop_factors[i], out_norm, calls.compiled)
                if out_norm is not None:
                    outs.append(out)
        return tuple(outs)

    def _conv_parameters(self) -> List[List[nn.Parameter]]:
        """The fp32 weights and biases of the convolutions, which autocast would cast, one group per stage (the
        stem its own)."""
        return [[p for m in part.modules() if isinstance(m, nn.Conv2d) for p in (m.weight, m.bias)
                 if p is not None and p.dtype == torch.float32] for part in (self.patch_embed, *self.layers)]

    def _freeze_stages(self):
        frozen = []
        if self.frozen_stages >= 0:
            frozen.append(self.patch_embed)
        for i in range(self.frozen_stages):
            frozen.append(self.layers[i])
            if str(i) in self.extra_norms:
                frozen.append(self.extra_norms[str(i)])
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self
