"""The variant of an operator that a call launches, and inputs of that variant at other sizes.

A variant is what selects the compiled code a call runs: the operator, the widths its kernels take as constexprs
(the channel count, the head width, the conv's kernel size), the flags it passes (RoPE, GELU, stochastic depth's
factors, the norm's output, the running statistics), the dtypes of its tensors, autocast's dtype (which selects
``COPY`` and the normalised map's dtype) and the layout of its maps. Sizes that only enter as runtime arguments
(batch, rows, columns, tokens, heads) are not part of it: one variant serves every image size, and every rank of a
job that runs one model meets the same variants in the same order (:mod:`.verdicts` relies on it).

:func:`variant_inputs` makes random inputs of a call's variant at other sizes: small ones for the check
(:mod:`.self_check`), a slice of the call's own size for the timing (:mod:`.timing`).
"""
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

# each operator's arguments, in the order its implementations take them, by what they are:
#   map: (B, C, H, W); heads: (B, h, N, d); tables: RoPE's (N, d) tables; factors: stochastic depth's (B, 1, 1, 1);
#   param: a parameter, random at its shape; same: the call's own tensor (the centre tap); stat: a running
#   statistic, copied for each run; None: a number or flag, passed on as it is
ARGUMENTS = {
    'mala_attention': ('heads', 'heads', 'heads', 'tables', None),
    'rotate_qk': ('map', 'tables', None),
    'residual_depthwise_conv': ('map', 'param', 'param', None, 'same'),
    'gated_depthwise_conv': ('map', 'map', 'map', 'param', 'param'),
    'scaled_residual': ('map', 'map', 'param', 'factors'),
    'scaled_residual_norm': ('map', 'map', 'param', 'factors', 'param', 'param', None, None),
    'batch_norm_gelu': ('map', 'param', 'param', 'stat', 'stat', None, None),
}
# the kinds whose gradients the check compares
DIFFERENTIATED = ('map', 'heads', 'param')
NAMES = {torch.float64: 'fp64', torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}


class Variant(NamedTuple):
    """One variant of an operator, as :func:`variant_of` reads it from a call."""
    operator: str
    widths: str  # e.g. 'C=64 k=3', 'd=64'
    flags: str  # e.g. 'gelu', 'rope', '-'
    dtypes: str  # each tensor argument's, then autocast's: 'fp32 fp32 fp32 autocast fp16'
    layout: str  # the strides' order and gaps of the first map (see _layout)

    def __str__(self) -> str:
        return f'{self.operator}[{self.widths}; {self.flags}; {self.dtypes}; {self.layout}]'


def variant_of(name: str, args: Sequence, autocast: Optional[torch.dtype]) -> Variant:
    """The variant of operator ``name`` that a call with ``args`` under ``autocast`` launches."""
    kinds = ARGUMENTS[name]
    first = args[0]
    if name == 'mala_attention':
        widths, flags = f'd={first.shape[-1]}', 'rope' if args[3] is not None else '-'
    elif name == 'rotate_qk':
        widths, flags = f'd={first.shape[1] // 4 // args[2]}', 'rope'
    else:
        widths = f'C={first.shape[1]}'
        widths += f' k={args[1].shape[-1]}' if name == 'residual_depthwise_conv' else ''
        widths += f' k={args[3].shape[-1]}' if name == 'gated_depthwise_conv' else ''
        flags = ' '.join(flag for flag, on in _flags(name, args) if on) or '-'
    dtypes = ' '.join(NAMES.get(t.dtype, str(t.dtype)) for t, kind in zip(args, kinds)
                      if isinstance(t, Tensor) and kind != 'same')
    dtypes += f' autocast {NAMES[autocast]}' if autocast is not None else ''
    return Variant(name, widths, flags, dtypes, _layout(first))


def _flags(name: str, args: Sequence) -> List[Tuple[str, bool]]:
    if name == 'residual_depthwise_conv':
        return [('gelu', bool(args[3])), ('centre_tap', args[4] is not None)]
    if name == 'scaled_residual':
        return [('factors', args[3] is not None)]
    if name == 'scaled_residual_norm':
        return [('factors', args[3] is not None), ('as_output', bool(args[7]))]
    if name == 'batch_norm_gelu':
        return [('running_stats', args[3] is not None)]
    return []


def _layout(t: Tensor) -> str:
    """The order of t's dimensions by stride, innermost first, and the gap factor of each over a dense layout
    (e.g. '1320 x4' for a channel slice of a channels-last map of four times as many channels)."""
    order = _order(t)
    return ' '.join(f'{d}x{pad}' if pad > 1 else str(d) for d, pad in zip(order, _gaps(t, order)))


def _order(t: Tensor) -> List[int]:
    return sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))


def _gaps(t: Tensor, order: List[int]) -> List[int]:
    """For each dimension in ``order``, how many times its stride exceeds the dense one after the previous."""
    gaps, dense = [], 1
    for d in order:
        gap = t.stride(d) // dense if dense and t.stride(d) % dense == 0 and t.shape[d] > 1 else 1
        gaps.append(max(1, gap))
        dense = t.stride(d) * t.shape[d] if t.shape[d] > 1 else dense
    return gaps


def random_like_layout(t: Tensor, shape: Sequence[int], generator: torch.Generator) -> Tensor:
    """Random values of ``shape`` in t's dtype, on t's device, laid out as t is (its strides' order and gaps)."""
    order = _order(t)
    strides, stride = [0] * t.dim(), 1
    for d, gap in zip(order, _gaps(t, order)):
        strides[d] = stride * gap
        stride = strides[d] * shape[d]
    storage = torch.randn(stride, generator=generator).to(device=t.device, dtype=t.dtype)
    return storage.as_strided(shape, strides)


def variant_inputs(name: str, args: Sequence, batch: int, rows: int, columns: int,
                   generator: torch.Generator) -> Tuple[tuple, List[int]]:
    """Random arguments of the call's variant at ``batch`` images of ``rows`` by ``columns`` pixels (tokens, for
    heads: rows * columns), with the positions of those whose gradients the check compares."""
    kinds = ARGUMENTS[name]
    made = []
    for t, kind in zip(args, kinds):
        if kind == 'map':
            t = random_like_layout(t, (batch, t.shape[1], rows, columns), generator)
        elif kind == 'heads':
            t = random_like_layout(t, (batch, t.shape[1], rows * columns, t.shape[3]), generator)
        elif kind == 'factors' and t is not None:
            t = (torch.rand(batch, 1, 1, 1, generator=generator) + 0.5).to(device=t.device, dtype=t.dtype)
        elif kind == 'param':
            t = torch.randn(t.shape, generator=generator).to(device=t.device, dtype=t.dtype)
        elif kind == 'stat' and t is not None:
            t = t.detach().clone()
        elif kind == 'tables' and t is not None:
            t = _tables(t, rows * columns, generator)
        made.append(t)
    wanted = [i for i, kind in enumerate(kinds) if kind in DIFFERENTIATED and isinstance(made[i], Tensor)
              and made[i].is_floating_point()]
    return tuple(made), wanted


def _tables(tables, tokens: int, generator: torch.Generator):
    """RoPE tables of ``tables``' type, dtype and width for ``tokens`` tokens of random angles, laid out as
    :class:`~mala_mm.ops.rope.RotaryTables` are: each pair's cos at its two channels, its sin negated at the even
    one."""
    cos = tables[0]
    pairs = cos.shape[-1] // 2
    angles = (torch.rand(tokens, pairs, generator=generator, dtype=torch.float64) * 6.3).repeat_interleave(2, dim=1)
    signs = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(pairs)
    return type(tables)(*(t.to(device=cos.device, dtype=cos.dtype) for t in (angles.cos(), angles.sin() * signs)))


def map_bytes(args: Sequence, name: str) -> int:
    """The bytes of a call's maps and heads: what scales with its pixels or tokens."""
    return sum(t.numel() * t.element_size() for t, kind in zip(args, ARGUMENTS[name]) if kind in ('map', 'heads'))


def spatial_size(name: str, args: Sequence) -> Tuple[int, int, int]:
    """(batch, rows, columns) of a call: tokens count as one row of N."""
    first = args[0]
    if ARGUMENTS[name][0] == 'heads':
        return first.shape[0], 1, first.shape[2]
    return first.shape[0], first.shape[2], first.shape[3]
