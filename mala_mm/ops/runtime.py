"""How the backbone runs its blocks, apart from what they compute: entered once per forward (:meth:`BlockRuntime.run`).

- Under autocast, the convolutions' low-precision weights are made for a group of parameters at once
  (:mod:`.weight_casts`), not one cast a convolution.
- With ``compile``, every block runs through one ``torch.compile``'d function (:func:`call_block`).
- In eager training, stochastic depth's per-sample factors of all the branches are drawn in two launches
  (:func:`~.residual.drop_path_factors`), not two a branch.
- The conv weights are stored channels-last, as their gradients come (:meth:`BlockRuntime.store_channels_last`).

Graphs (traced, compiled or exported: :func:`~.torch_compat.in_graph`) get none of this: they record the plain
operators, which their compilers fuse.
"""
import contextlib
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .conv2d import channels_last_strides
from .dispatch import log_new_choices
from .residual import drop_path_factors
from .torch_compat import autocast_dtype, autocast_enabled, in_graph, recompile_limit
from .weight_casts import low_precision_weights

# graphs the compiled block may take per kind of block (dynamo's own default for a function) before dynamo runs the
# blocks it has no graph for eagerly
GRAPHS_PER_BLOCK_KIND = 8


def call_block(block: nn.Module, x: Tensor, *args) -> Tensor:
    """``block(x, *args)``: the function that ``torch.compile`` compiles for every block. One function serves every
    block: compiling blocks, not the whole backbone, keeps the symbolic sizes of each graph those of one map (the
    backbone's nest a ceiling division per stride-2 conv), and a stage's blocks share a graph. The block is an
    argument, so that a deep copy of the module (an EMA model) runs its own parameters through it."""
    return block(x, *args)


def compiled_block(compile: Union[bool, dict]) -> Optional[Callable]:
    """:func:`call_block` compiled as ``compile`` asks (True, or a dict of ``torch.compile`` arguments over
    ``fullgraph=True, dynamic=True``; torch >= 2.4, whose custom operators the compiled convolutions need), or None
    for False."""
    if compile is False:
        return None
    options = dict(fullgraph=True, dynamic=True)
    options.update({} if compile is True else compile)
    return torch.compile(call_block, **options)


class BlockCalls(NamedTuple):
    """How one forward calls its stages' blocks.

    Attributes:
        compiled: the compiled :func:`call_block`, or None: each block is called eagerly.
        drop_factors: per stage, its branches' (2 depth, B, 1, 1, 1) stochastic depth factors, or None where none
            were drawn (eval, graphs, compiled blocks, no stochastic depth).
    """
    compiled: Optional[Callable]
    drop_factors: Sequence[Optional[Tensor]]


class BlockRuntime:
    """The runtime of one backbone's blocks.

    Args:
        branches: the number of branches of each stage.
        drops_paths: whether stochastic depth drops any branch while training.
        conv_groups: returns the groups of fp32 conv parameters whose low-precision copies are made together.
        compile: as :func:`compiled_block`.
        block_kinds: the kinds of block the compiled function serves, each with its own graphs.
        weight_copies: whether eager forwards under autocast make the weights' copies (not with activation
            checkpointing, whose recomputation would not see them).
    """

    def __init__(self, branches: Sequence[int], drops_paths: bool, conv_groups: Callable[[], List[List[Tensor]]],
                 compile: Union[bool, dict] = False, block_kinds: int = 1, weight_copies: bool = True):
        self.branches, self.drops_paths = list(branches), drops_paths
        self.conv_groups, self.weight_copies = conv_groups, weight_copies
        self.compiled = compiled_block(compile)
        self.graph_limit = GRAPHS_PER_BLOCK_KIND * block_kinds

    @staticmethod
    def store_channels_last(module: nn.Module) -> None:
        """Stores every conv weight of ``module`` with channels-last strides, as its gradient comes: autograd then makes
        no copy into the weight's layout, and DDP none into its buckets (where it would warn "Grad strides do not match
        bucket view strides" at every step). Values and state dict keys are unchanged; loading copies into this
        layout."""
        for conv in module.modules():
            if isinstance(conv, nn.Conv2d):
                conv.weight = nn.Parameter(channels_last_strides(conv.weight.detach()),
                                           requires_grad=conv.weight.requires_grad)

    @contextlib.contextmanager
    def run(self, x: Tensor, keep_probs: Optional[Tensor]) -> Iterator[BlockCalls]:
        """The context of one forward of the (B, C, H, W) batch ``x``, giving how it calls its blocks.
        ``keep_probs``: while training, each branch's (n,) probability of being kept, stage after stage; else
        None."""
        if in_graph():
            yield BlockCalls(None, [None] * len(self.branches))
        elif self.compiled is not None:
            with recompile_limit(self.graph_limit):
                yield BlockCalls(self.compiled, [None] * len(self.branches))
        else:
            with self._weight_copies(x):
                yield BlockCalls(None, self._drop_factors(x.shape[0], keep_probs))
            log_new_choices()  # the kernel variants this forward met first, decided, as one table

    def _weight_copies(self, x: Tensor):
        device = x.device.type
        dtype = autocast_dtype(device) if autocast_enabled(device) else None
        if not self.weight_copies or dtype not in (torch.float16, torch.bfloat16):
            return contextlib.nullcontext()
        return low_precision_weights(self.conv_groups(), dtype)

    def _drop_factors(self, batch: int, keep_probs: Optional[Tensor]) -> Sequence[Optional[Tensor]]:
        if keep_probs is None or not self.drops_paths:
            return [None] * len(self.branches)
        return drop_path_factors(keep_probs, batch).split(self.branches)
