"""MALA (MAViT) backbone for dense prediction."""
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...checkpoint import load_backbone_weights
from ...ops.torch_compat import HAS_CUSTOM_OPS, autocast_dtype, autocast_enabled, is_compiling, recompile_limit
from ...ops.weight_casts import low_precision_weights
from ..layers import ATTENTION_KINDS, ConvStem, LayerNorm2d, MALAStage, rope_head_dims
from ..layers.attention import check_attn_impl
from ..layers.blocks import call_block
from ..layers.conv import channels_last_strides

# graphs the compiled block may take per kind of block (dynamo's own default for a function) before dynamo runs the
# blocks it has no graph for eagerly
GRAPHS_PER_BLOCK_KIND = 8


class MALAConfigError(ValueError):
    """An argument of :class:`MALA` that cannot build a model; the message says which and what is allowed."""


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
        compile: run each block through ``torch.compile`` with ``fullgraph=True, dynamic=True`` (torch >= 2.4),
            the stem, downsamples and output norms eagerly: one graph per kind of block (a stage's blocks, the
            first one apart where stochastic depth drops the others) for training and one for eval, across input
            sizes, except that inductor's CPU code adds one where a sum over tokens crosses 4096 elements
            (docs/dev/benchmarks.md). True, or a dict of ``torch.compile`` arguments (``mode``, ``backend``,
            ``options``, or ``dynamic`` and ``fullgraph`` in place of those above). Parameters and state dict are
            unchanged; tracing and export see the plain forward.
        attn_impl: how the attention runs: 'triton' in fused Triton kernels (forward and backward, fp32
            arithmetic whatever the input's precision), 'torch' in torch operators, or 'auto' (default): Triton's
            for CUDA tensors where Triton is installed, torch's elsewhere. Traced, exported and compiled graphs
            always take torch's. Both compute the same formula; parameters and state dict are unchanged.
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
    custom_arch_defaults = dict(mlp_ratio=3.5, layer_scale_init=1.0, drop_path_rate=0.1)

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
                 attn_impl: str = 'auto',
                 init_cfg: Optional[dict] = None):
        if init_cfg is not None and (not isinstance(init_cfg, dict) or init_cfg.get('type') != 'Pretrained'
                                     or not init_cfg.get('checkpoint')):
            raise MALAConfigError(f"MALA: init_cfg must be None (the release's initialisation) or "
                                  f"dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix=...]), got {init_cfg}")
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        num_stages = len(arch['depths'])
        self.embed_dims = list(arch['embed_dims'])
        self.in_channels = in_channels

        if isinstance(attn_types, str):
            attn_types = [attn_types] * num_stages
        attn_types = [kind.lower() for kind in attn_types]
        if len(attn_types) != num_stages or any(kind not in ATTENTION_KINDS for kind in attn_types):
            raise MALAConfigError(f'MALA: attn_types must be one of {sorted(ATTENTION_KINDS)} or a sequence of '
                                  f'{num_stages} of them, got {attn_types}')
        self.attn_types = attn_types

        self.out_indices = tuple(out_indices)
        if not self.out_indices or any(not 0 <= i < num_stages for i in self.out_indices):
            raise MALAConfigError(f'MALA: out_indices must be non-empty stage indices in [0, {num_stages}), '
                                  f'got {out_indices}')
        if not -1 <= frozen_stages <= num_stages:
            raise MALAConfigError(f'MALA: frozen_stages must be in [-1, {num_stages}], got {frozen_stages}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        check_attn_impl(attn_impl, 'MALA: ', MALAConfigError)

        if drop_path_rate is None:
            drop_path_rate = arch['drop_path_rate']
        rates = torch.linspace(0, drop_path_rate, sum(arch['depths'])).tolist()
        layer_scale = arch['layer_scale_init']
        if layer_scale is None or isinstance(layer_scale, (int, float)):
            layer_scale = [layer_scale] * num_stages

        self.patch_embed = ConvStem(in_channels, self.embed_dims[0], norm_cfg)
        self.layers = nn.ModuleList()
        for i in range(num_stages):
            first = sum(arch['depths'][:i])
            self.layers.append(MALAStage(
                embed_dims=self.embed_dims[i],
                num_heads=arch['num_heads'][i],
                attn_type=attn_types[i],
                mlp_ratio=arch['mlp_ratio'],
                drop_paths=rates[first:first + arch['depths'][i]],
                layer_scale_init=layer_scale[i],
                out_dims=self.embed_dims[i + 1] if i + 1 < num_stages else None,
                norm_cfg=norm_cfg,
                with_cp=with_cp,
                attn_impl=attn_impl))
        # keyed by stage index so that the state dict reads extra_norms.{i}.* as released
        self.extra_norms = nn.ModuleDict({str(i): LayerNorm2d(self.embed_dims[i]) for i in self.out_indices})
        # The maps are channels-last throughout (forward), and so are the gradients of every conv weight; stored
        # with those very strides, each weight takes its gradient as it comes: autograd makes no copy into the
        # weight's layout, and DDP none into its buckets (where it would warn "Grad strides do not match bucket
        # view strides" at every step). Values and state dict keys are unchanged; loading copies into this layout.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                module.weight = nn.Parameter(channels_last_strides(module.weight.detach()))
        self._freeze_stages()
        # the kinds of block a compiled function serves: a stage's blocks, and where stochastic depth is on, the first
        # block of the first stage apart from the others (its rate is 0, so it has no DropPath)
        self._block_kinds = num_stages + 1
        self._compiled_block = self._compile_block(compile)
        self.with_cp = with_cp

    @staticmethod
    def _compile_block(compile: Union[bool, dict]):
        """:func:`call_block` compiled as ``compile`` asks, or None. One function serves every block: compiling
        blocks, not the whole backbone, keeps the symbolic sizes of each graph those of one map (the backbone's
        nest a ceiling division per stride-2 conv), and a stage's blocks share a graph. The block is an argument,
        so that a deep copy of the module (an EMA model) runs its own parameters through it."""
        if compile is False:
            return None
        if not HAS_CUSTOM_OPS:
            raise MALAConfigError(f'MALA: compile needs torch >= 2.4 (its custom operators), this is '
                                  f'{torch.__version__}')
        if compile is not True and not isinstance(compile, dict):
            raise MALAConfigError(f'MALA: compile must be a bool or a dict of torch.compile arguments, '
                                  f'got {compile!r}')
        options = dict(fullgraph=True, dynamic=True)
        options.update({} if compile is True else compile)
        return torch.compile(call_block, **options)

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise MALAConfigError(f'MALA: unknown arch {arch!r}; choose one of {sorted(set(cls.arch_zoo))} '
                                      f'or pass a dict with embed_dims, depths and num_heads')
            return cls.arch_zoo[arch.lower()]
        if not isinstance(arch, dict):
            raise MALAConfigError(f'MALA: arch must be a name or a dict, got {type(arch).__name__}')
        required = {'embed_dims', 'depths', 'num_heads'}
        allowed = required | set(cls.custom_arch_defaults)
        if not required <= set(arch) or not set(arch) <= allowed:
            raise MALAConfigError(f'MALA: a custom arch needs {sorted(required)} and may set '
                                  f'{sorted(cls.custom_arch_defaults)}; got keys {sorted(arch)}')
        arch = {**cls.custom_arch_defaults, **arch}
        lengths = {len(arch[key]) for key in required}
        if len(lengths) != 1:
            raise MALAConfigError(f'MALA: embed_dims, depths and num_heads need one entry per stage, got {arch}')
        if isinstance(arch['layer_scale_init'], (list, tuple)) and len(arch['layer_scale_init']) not in lengths:
            raise MALAConfigError(
                f'MALA: layer_scale_init needs one entry per stage, got {arch["layer_scale_init"]}')
        for stage, (channels, heads) in enumerate(zip(arch['embed_dims'], arch['num_heads'])):
            rope_head_dims(channels, heads, f'MALA: in stage {stage}, ', MALAConfigError)
        return arch

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
        if self._compiled_block is not None and not (torch.jit.is_tracing() or is_compiling()):
            with recompile_limit(GRAPHS_PER_BLOCK_KIND * self._block_kinds):
                return self._features(x, self._compiled_block)
        dtype = self._weight_cast_dtype(x)
        if dtype is None:
            return self._features(x)
        with low_precision_weights(self._conv_parameters(), dtype):
            return self._features(x)

    def _weight_cast_dtype(self, x: Tensor) -> Optional[torch.dtype]:
        """The dtype autocast casts the convolutions' weights to in this forward, where the backbone makes those
        copies itself (:mod:`mala_mm.ops.weight_casts`), else None: traced, exported and compiled graphs and
        checkpointed blocks, whose recomputation would not see the copies, leave them to autocast."""
        device = x.device.type
        if self.with_cp or not autocast_enabled(device) or torch.jit.is_tracing() or is_compiling():
            return None
        dtype = autocast_dtype(device)
        return dtype if dtype in (torch.float16, torch.bfloat16) else None

    def _conv_parameters(self) -> List[List[nn.Parameter]]:
        """The fp32 weights and biases of the convolutions, which autocast would cast, one group per stage (the
        stem its own)."""
        return [[p for m in part.modules() if isinstance(m, nn.Conv2d) for p in (m.weight, m.bias)
                 if p is not None and p.dtype == torch.float32] for part in (self.patch_embed, *self.layers)]

    def _features(self, x: Tensor, run_block: Callable = call_block) -> tuple:
        # channels-last throughout: depth-wise convs run about 3x faster on it than on NCHW, and elementwise ops
        # between maps of one layout several times faster than across layouts
        x = self.patch_embed(x.contiguous(memory_format=torch.channels_last))
        outs = []
        for i, stage in enumerate(self.layers):
            out, x = stage(x, run_block)
            if i in self.out_indices:
                # LayerNorm2d leaves channels-last strides; mmcv's RoIAlign and other compiled ops read their
                # input as contiguous NCHW memory and would gather the wrong values from such a map
                outs.append(self.extra_norms[str(i)](out).contiguous())
        return tuple(outs)

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
