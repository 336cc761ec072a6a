"""The torch queries and shims the layers and ops use, on every torch this package supports: 2.4 gave autocast's
queries a device argument and custom operators (``torch.library.custom_op``), 2.3 named
``torch.compiler.is_compiling``; torch 2.1 has the queries per device and under torch._dynamo, and no
``_foreach_copy_``. Dynamo's ``cache_size_limit`` became ``recompile_limit`` in 2.7."""
from typing import Optional

import torch
from torch import Tensor

_NEW_AUTOCAST_API = hasattr(torch, 'get_autocast_dtype')
HAS_CUSTOM_OPS = hasattr(torch.library, 'custom_op')


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ('cpu', 'cuda', ...); never for a device autocast does not
    know ('meta': shapes without data)."""
    if _NEW_AUTOCAST_API:
        try:
            return torch.is_autocast_enabled(device_type)
        except RuntimeError:  # unknown device type for autocast
            return False
    if device_type == 'cpu':
        return torch.is_autocast_cpu_enabled()
    return device_type == 'cuda' and torch.is_autocast_enabled()


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast casts to on ``device_type``."""
    if _NEW_AUTOCAST_API:
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == 'cpu' else torch.get_autocast_gpu_dtype()


def autocast_of(t: Tensor) -> Optional[torch.dtype]:
    """The dtype that autocast casts to on ``t``'s device where it is on there, else None: what a forward records
    for a backward that may recompute it in torch operators, and what a check of a call runs under."""
    device = t.device.type
    return autocast_dtype(device) if autocast_enabled(device) else None


def is_compiling() -> bool:
    """Whether torch.compile is tracing the code that asks."""
    if hasattr(torch.compiler, 'is_compiling'):
        return torch.compiler.is_compiling()
    return torch._dynamo.is_compiling()


def is_exporting() -> bool:
    """Whether torch.export is tracing the code that asks (torch >= 2.5 tells; before, it counts as compiling).

    torch 2.11's dynamo answers ``torch.compiler.is_exporting()`` with True under torch.compile too; 2.13's reads
    the flag that torch.export sets, ``torch.compiler._is_exporting_flag``, which is read here where it exists."""
    flag = getattr(torch.compiler, '_is_exporting_flag', None)
    if flag is not None:
        return flag
    return hasattr(torch.compiler, 'is_exporting') and torch.compiler.is_exporting()


def in_graph() -> bool:
    """Whether the code that asks is being recorded into a graph: traced (``torch.jit``, ONNX's TorchScript
    exporter), compiled (``torch.compile``) or exported (``torch.export``, ONNX's dynamo exporter). Graphs record
    the plain torch operators, which their compilers fuse and export, and compute what depends on the input's size
    from it."""
    return torch.jit.is_tracing() or is_compiling() or is_exporting()


def compiling_to_run() -> bool:
    """Whether torch.compile is tracing the code that asks to run it here, not torch.export to export it."""
    return is_compiling() and not is_exporting()


def recompile_limit(limit: int):
    """A context in which dynamo compiles one function for up to ``limit`` sets of guards (argument types, shapes,
    grad mode) before it runs that function eagerly; dynamo's default is 8."""
    import torch._dynamo  # loaded already by torch.compile, which a caller of this has called
    config = torch._dynamo.config
    return config.patch(**{'recompile_limit' if hasattr(config, 'recompile_limit') else 'cache_size_limit': limit})


def foreach_copy_(destinations, sources) -> None:
    """``destinations[i].copy_(sources[i])`` for each i, in one multi-tensor kernel where torch has it (2.2)."""
    if hasattr(torch, '_foreach_copy_'):
        torch._foreach_copy_(destinations, sources)
        return
    for destination, source in zip(destinations, sources):
        destination.copy_(source)
