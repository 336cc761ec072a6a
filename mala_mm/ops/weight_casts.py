"""Autocast's weight casts, made for a group of parameters at once.

Under autocast each convolution casts its weight and its bias to the autocast dtype in every forward, one kernel
each, and in training casts their gradients back, one more each: launches whose GPU time is the time of launching
them (docs/dev/benchmarks.md counts them for MALA-T). :func:`low_precision_weights` makes the
same copies (round to nearest, the strides of each parameter) with one multi-tensor copy per group, and their
gradients with one more. The convolutions take them through :func:`low_precision`, and autocast, finding them in
its dtype already, casts nothing more. Values and gradients are those of autocast's own casts.
"""
import contextlib
import contextvars
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .torch_compat import autocast_enabled, foreach_copy_, in_graph

# the copies of the running forward (low_precision_weights), by parameter id: anything with get(id) -> copy or None
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar('mala_low_precision_weights', default=None)


def low_precision(param: Optional[Tensor]) -> Optional[Tensor]:
    """The low-precision copy of ``param`` made for the running forward, or ``param`` itself where there is none
    or where autocast is off (a region of the forward that turns it off computes with the parameters)."""
    # a graph leaves the casts to autocast (and torch.compile reads no context variable)
    copies = None if in_graph() else _ACTIVE.get()
    if copies is None or param is None or not autocast_enabled(param.device.type):
        return param
    copy = copies.get(id(param))
    return param if copy is None else copy


def _copies(sources: Sequence[Tensor], likes: Sequence[Tensor], dtype: Optional[torch.dtype] = None) -> List[Tensor]:
    """``sources`` copied in one multi-tensor copy into tensors with the strides of ``likes``, in ``dtype`` (default:
    each like's own)."""
    out = [torch.empty_like(like, dtype=dtype) for like in likes]
    foreach_copy_(out, list(sources))
    return out


class _CastGroup(torch.autograd.Function):
    """(dtype, *params) -> the params in dtype; their gradients go back to the params' dtype in one copy."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *params: Tensor) -> Tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)  # a copy that no operator read gives its parameter no gradient
        ctx.save_for_backward(*params)
        return tuple(_copies(params, params, dtype))

    @staticmethod
    def backward(ctx, *grads: Optional[Tensor]):
        params = ctx.saved_tensors
        wanted = [i for i, grad in enumerate(grads) if grad is not None and ctx.needs_input_grad[i + 1]]
        result: List[Optional[Tensor]] = [None] * len(params)
        # with the parameters' strides, so that autograd stores them as the gradients without another copy
        for i, grad in zip(wanted, _copies([grads[i] for i in wanted], [params[i] for i in wanted])):
            result[i] = grad
        return (None, *result)


class _CopiedOnFirstRead:
    """One training forward's copies, by parameter id: a group's are made when one of its parameters is first read,
    so that in the backward each group's gradients are copied back as soon as its stage is done (autograd runs a
    node once the later ones are), and DDP reduces them while the earlier stages' backward runs."""

    def __init__(self, groups: Sequence[Sequence[nn.Parameter]], dtype: torch.dtype):
        self._dtype = dtype
        self._group_of = {id(p): group for group in groups for p in group}
        self._copies: Dict[int, Tensor] = {}

    def get(self, key: int) -> Optional[Tensor]:
        if key not in self._copies and key in self._group_of:
            group = self._group_of[key]
            self._copies.update(zip(map(id, group), _CastGroup.apply(self._dtype, *group)))
        return self._copies.get(key)


@contextlib.contextmanager
def low_precision_weights(groups: Sequence[Sequence[nn.Parameter]], dtype: torch.dtype) -> Iterator[None]:
    """Inside, :func:`low_precision` gives the ``dtype`` copies of the parameters of ``groups``. Where gradients flow,
    each group's are made by one launch when first read (a group per stage keeps DDP's reduction overlapping the
    backward); without gradients, all in one launch. They are made anew for every forward: kept between forwards,
    they would miss a change through ``.data``, which no version counter records (mmengine's EMA hook swaps the
    averaged weights in and out that way)."""
    groups = [list(group) for group in groups if group]
    if torch.is_grad_enabled():
        copies = _CopiedOnFirstRead(groups, dtype)
    else:
        params = [p for group in groups for p in group]
        copies = dict(zip(map(id, params), _copies([p.detach() for p in params], params, dtype)))
    token = _ACTIVE.set(copies)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
