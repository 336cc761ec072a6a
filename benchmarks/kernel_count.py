"""The kernels one step launches and the memory it holds, counted on any machine: MALA-T against Swin-T, backbone
and whole dense models.

A GPU step of these models is bound by launching kernels, not by arithmetic (results/h200/fused/launches.md): its
time follows the number of kernels. That number is the same on every device, so it is counted here on the CPU.

What counts, for one steady-state step (after a warm-up step): every ATen operator dispatched (a
``TorchDispatchMode`` sees autocast's casts and the backward's operators too) except views and those that only
allocate or read metadata; a multi-tensor (``_foreach_``) operator as the launches CUDA's kernels for it make
(:func:`foreach_launches`); each Triton kernel launch as one. MALA-T runs its default CUDA path,
``impl='triton'``, on CPU tensors (this script sets ``TRITON_INTERPRET=1``, under which the Triton launchers
take them): each launch is recorded, not run (:func:`triton_launches_recorded`). Bytes: each counted operator's
tensor inputs read and outputs written, each Triton launch's tensor arguments once. A training step is the loss's
forward and backward into gradients set to None, as the optimizer wrapper leaves them, without the optimizer's step.
Autocast is the CPU's, which casts these models' operators as CUDA's does but for softmax, which CUDA's runs in
fp32: on a GPU, Swin-T's attention has a cast more a block than counted here.

Each row is also split by part of the model: a forward operator counts towards the innermost module that ran it,
a backward operator towards the module whose forward made the autograd node it evaluates.

Memory, the same on every device too: each storage an operator of the step allocates (a Triton launcher's outputs
included) is held from its allocation to its release, and the step's peak is the most held at once, over what was
held before it (parameters, inputs, caches); the bytes saved for the backward are those of the storages the step
allocated that autograd saved (each once), not the parameters nor RoPE's cached tables, which outlive the step.
Training steps are also counted for MALA-T on its torch path (CPU training, compiled and exported graphs).

    python -m benchmarks.kernel_count [--quick] [--only backbone|mask_rcnn|upernet ...]

writes results/cpu/kernel_count.{md,json}; ``--quick`` counts at small inputs and writes kernel_count_quick (the
backbone's kernels do not depend on the input size; its bytes and memory do).
"""
import argparse
import collections
import contextlib
import os
import re
import weakref
from typing import Dict, List, Optional

os.environ.setdefault('TRITON_INTERPRET', '1')  # before mala_mm imports Triton: its kernels then run on CPU tensors

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from .common import markdown_table, write_results  # noqa: E402

# operators that launch no kernel: they allocate, alias or read metadata (views are told by their schema)
NO_KERNEL = {'empty', 'empty_strided', 'new_empty', 'new_empty_strided', 'empty_like', 'detach', 'alias',
             '_unsafe_view', 'lift_fresh', 'set_', 'resize_', 'squeeze_', 'unsqueeze_', 't_', 'transpose_',
             'as_strided_'}
# operators that return no tensor yet launch: a device-to-host copy of a value
READS_DEVICE = {'_local_scalar_dense', 'equal', 'is_nonzero'}
OUTSIDE = 'outside modules'
# a backbone's parts, from a module's qualified name (first match wins); MALA's and mmdet's Swin's names
BACKBONE_PARTS = [
    (r'(^|\.)patch_embed(\.|$)', 'stem'),
    (r'(^|\.)downsample(\.|$)', 'downsamples'),
    (r'^(extra_norms\.\d+|norm\d)$', 'output norms'),
    (r'\.pos$', 'position conv'),
    (r'\.attn(\.|$)', 'attention'),
    (r'\.ffn(\.|$)', 'FFN'),
    (r'\.norm[12]$', 'block norms'),
    (r'\.blocks\.\d+$', 'residual branches'),
]
AUTOCAST = {'fp32': None, 'bf16': torch.bfloat16}
# MALA-T on its torch path (CPU training, compiled and exported graphs), counted for training steps
TORCH_PATH = 'MALA-T torch'
MIB = 2 ** 20
SIZES = {'full': dict(backbone=[(800, 1280), (512, 2048)], mask_rcnn=(800, 1333), upernet=(512, 512)),
         'quick': dict(backbone=[(64, 96)], mask_rcnn=(128, 160), upernet=(64, 64))}
DENSE = {
    # (ours, mmdet's or mmseg's own Swin-T config, the dtypes counted: mmcv's CPU RoIAlign has no bf16 kernel)
    'mask_rcnn': ('detection/mask_rcnn_mala_t.py', 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', ('fp32',)),
    'upernet': ('segmentation/upernet_mala_t.py',
                'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py', ('fp32', 'bf16')),
}


# CUDA's multi-tensor kernels (ATen's MultiTensorApply.cuh): a launch takes up to this many tensors of each list,
# by the number of lists, and up to 320 blocks of 65536 elements
MULTI_TENSOR_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
MULTI_TENSOR_MAX_BLOCKS = 320
MULTI_TENSOR_CHUNK = 65536


def foreach_launches(lists: List[List[torch.Tensor]]) -> int:
    """The kernels a ``_foreach_`` operator over ``lists`` launches on CUDA: as MultiTensorApply.cuh hands out its
    tensors and their chunks, where every list has one size and strides a position (and the sources one dtype),
    else one a tensor (its fallback)."""
    fast = all(len({(t.shape, t.stride()) for t in position}) == 1 for position in zip(*lists)) and \
        len({t.dtype for t in lists[-1]}) == 1
    if not fast:
        return len(lists[0])
    max_tensors, launches, tensors, blocks = MULTI_TENSOR_MAX_TENSORS[len(lists)], 0, 0, 0
    sizes = [t.numel() for t in lists[0] if t.numel()]
    for i, numel in enumerate(sizes):
        tensors += 1
        chunks = -(-numel // MULTI_TENSOR_CHUNK)
        for chunk in range(chunks):
            blocks += 1
            last_of_tensor = chunk == chunks - 1
            if (tensors == max_tensors and last_of_tensor) or blocks == MULTI_TENSOR_MAX_BLOCKS or \
                    (i == len(sizes) - 1 and last_of_tensor):
                launches += 1
                blocks = 0
                tensors = 0 if last_of_tensor else 1
    return launches


def _tensors(tree) -> List[torch.Tensor]:
    flat = tree if isinstance(tree, (tuple, list)) else (tree,)
    found = []
    for item in flat:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            found += _tensors(item)
    return found


def _in_fp32(arg):
    """A tensor in fp32, the tensors of a named tuple (RoPE's tables) too; anything else as it is."""
    if isinstance(arg, torch.Tensor):
        return arg.float() if arg.is_floating_point() else arg
    if isinstance(arg, tuple) and hasattr(arg, '_fields'):
        return type(arg)(*map(_in_fp32, arg))
    return arg


def _bytes(tensors) -> int:
    seen = {(t.data_ptr(), t.shape, t.dtype) for t in tensors}
    return sum(torch.Size(shape).numel() * dtype.itemsize for _, shape, dtype in seen)


class KernelCounter(TorchDispatchMode):
    """Counts launches (and bytes) by part while on; ``part_of`` names a module's part (None: its parent's). Also
    the memory of the step: each storage that an operator allocates is live from its allocation to its release
    (a finalizer on the storage), and :meth:`saving` records which of them autograd saves for the backward."""

    def __init__(self, model: nn.Module, part_of):
        super().__init__()
        self.model, self.part_of = model, part_of
        self.kernels: Dict[str, int] = collections.Counter()
        self.bytes = self.casts = 0
        self.live_bytes = self.peak_bytes = 0
        self.saved: Dict[int, int] = {}  # bytes of each storage saved for the backward, by address
        self._allocated: Dict[int, int] = {}
        self._parts: List[str] = []
        self._paused = False

    def _allocations(self, inputs: List[torch.Tensor], outputs: List[torch.Tensor]) -> None:
        """Counts the storages of ``outputs`` that no input holds and none counted before as allocated now."""
        held = {t.untyped_storage().data_ptr() for t in inputs}
        for t in outputs:
            storage = t.untyped_storage()
            address, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes and address not in held and address not in self._allocated:
                self._allocated[address] = nbytes
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                weakref.finalize(storage, self._released, address)

    def _released(self, address: int) -> None:
        self.live_bytes -= self._allocated.pop(address, 0)

    @contextlib.contextmanager
    def saving(self):
        """Records each storage that autograd saves for the backward, once, where the step allocated it: not the
        parameters, nor what lives across steps (RoPE's cached tables), which no step adds."""
        def pack(t: torch.Tensor) -> torch.Tensor:
            address = t.untyped_storage().data_ptr()
            if not self._paused and address in self._allocated:
                self.saved[address] = self._allocated[address]
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def record(self, part: Optional[str], nbytes: int, launches: int = 1, cast: bool = False) -> None:
        if self._paused:
            return
        self.kernels[part or OUTSIDE] += launches
        self.bytes += nbytes
        self.casts += launches if cast else 0

    def _current_part(self) -> Optional[str]:
        node = torch._C._current_autograd_node()
        if node is not None:  # in the backward: the part whose forward made the node
            return node.metadata.get('part')
        return self._parts[-1] if self._parts else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split('::')[-1]
        if not self._paused and not func.is_view:
            self._allocations(_tensors(list(args) + list((kwargs or {}).values())), _tensors(out))
        # an operator with no tensor out launches nothing, unless it reads a value back from the device or, as the
        # in-place multi-tensor operators, writes into its arguments
        launches_kernel = bool(_tensors(out)) or name in READS_DEVICE or name.startswith('_foreach_')
        if launches_kernel and not func.is_view and name not in NO_KERNEL:
            inputs = _tensors(list(args) + list((kwargs or {}).values()))
            nbytes = _bytes(inputs) + _bytes(_tensors(out))
            if name.startswith('_foreach_'):
                lists = [list(arg) for arg in args if isinstance(arg, (list, tuple)) and arg and
                         all(isinstance(t, torch.Tensor) for t in arg)]  # not a list of scalars
                self.record(self._current_part(), nbytes, launches=foreach_launches(lists),
                            cast=name == '_foreach_copy_' and lists[0][0].dtype != lists[1][0].dtype)
            else:
                self.record(self._current_part(), nbytes, cast=name == '_to_copy' and inputs[0].dtype != out.dtype)
        return out

    @contextlib.contextmanager
    def paused(self):
        self._paused, before = True, self._paused
        try:
            yield
        finally:
            self._paused = before

    @contextlib.contextmanager
    def parts(self):
        """Module hooks that keep the current part and tag the autograd nodes each module's forward made."""
        labels = {}
        for name, module in self.model.named_modules():
            labels[module] = self.part_of(name)

        def enter(module, inputs):
            outer = self._parts[-1] if self._parts else None
            if outer is not None:  # what the outer module made before calling this one is the outer module's
                _tag_nodes([t.grad_fn for t in _tensors(inputs) if t.grad_fn is not None], outer)
            label = labels.get(module)
            self._parts.append(label if label is not None else outer)

        def leave(module, _, output):
            part = self._parts.pop()
            if part is not None:
                _tag_nodes([t.grad_fn for t in _tensors(output) if t.grad_fn is not None], part)

        handles = [h for m in labels for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _tag_nodes(nodes, part: str) -> None:
    """Tag ``nodes`` and the untagged nodes behind them with ``part``: what a module's forward made and no inner
    module tagged first."""
    while nodes:
        node = nodes.pop()
        if node is None or 'part' in node.metadata:
            continue
        node.metadata['part'] = part
        nodes += [parent for parent, _ in node.next_functions]


@contextlib.contextmanager
def triton_launches_recorded(counter: KernelCounter):
    """Each Triton kernel launch counted as one kernel and not run: Triton's interpreter would take minutes at the
    papers' sizes. The launchers themselves run, and their operators count; then each operator's results take the
    values of its torch operators (not counted), written through ``.data`` so that autograd's records of them stay
    as the launcher left them, and what follows computes on real values. The backward's launches leave their
    gradients as allocated."""
    from triton.runtime.interpreter import GridExecutor

    from mala_mm.ops import OPERATORS
    interpreted_launch = GridExecutor.__call__
    launchers = {operator: operator.triton for operator in OPERATORS.values()}

    # each launch calls the interpreter's GridExecutor, from Triton 3.2 to 3.9: through InterpretedFunction.run from
    # Triton 3.6, through its own __getitem__ before, when GridExecutor takes warmup= itself
    def recorded_launch(self, *args, warmup=False, **kwargs):
        if not warmup:
            counter.record(counter._current_part(), _bytes(_tensors(list(args) + list(kwargs.values()))))

    def with_values(operator, launcher):
        def run(*args, torch_fallback=None):
            outputs = launcher(*args, torch_fallback=torch_fallback)
            # in fp32: under autocast the torch operators would make the weights' low-precision copies, which
            # belong to the step's own operators
            with counter.paused(), torch.no_grad(), torch.autocast('cpu', enabled=False):
                for out, value in zip(_tensors(outputs), _tensors(operator.torch(*map(_in_fp32, args)))):
                    out.data.copy_(value)
            return outputs
        return run

    GridExecutor.__call__ = recorded_launch
    for operator, launcher in launchers.items():
        operator.triton = with_values(operator, launcher)
    try:
        yield
    finally:
        GridExecutor.__call__ = interpreted_launch
        for operator, launcher in launchers.items():
            operator.triton = launcher


def count(model: nn.Module, step, dtype: Optional[torch.dtype], part_of) -> dict:
    """Kernels, bytes, casts and the kernels by part of one ``step(autocast)`` after a warm-up one, and its memory:
    the bytes saved for the backward and the peak of the bytes its operators allocated and still held. The step
    runs its forward inside ``autocast()``, as mmengine's optim wrapper does, its backward outside."""
    def autocast():  # one context a forward: autocast keeps its casts until it is left
        return torch.autocast('cpu', dtype=dtype) if dtype else contextlib.nullcontext()
    counter = KernelCounter(model, part_of)
    with triton_launches_recorded(counter):
        with counter.paused():
            step(autocast)
        with counter.parts(), counter.saving(), counter:
            step(autocast)
    return dict(kernels=sum(counter.kernels.values()), bytes=counter.bytes, casts=counter.casts,
                saved_bytes=sum(counter.saved.values()), peak_bytes=counter.peak_bytes,
                parts=dict(counter.kernels.most_common()))


def backbone_part(name: str) -> Optional[str]:
    return next((part for pattern, part in BACKBONE_PARTS if re.search(pattern, name)), None)


def dense_part(name: str) -> Optional[str]:
    """A dense model's parts: its top-level modules (backbone, neck, heads)."""
    return name if name and '.' not in name else None


def backbone_steps(model: nn.Module, x: torch.Tensor):
    def eval_step(autocast):
        model.eval()
        with torch.no_grad(), autocast():
            model(x)

    def train_step(autocast):
        model.train()
        model.zero_grad(set_to_none=True)  # as the optimizer wrapper does: the gradients are stored, not added
        with autocast():
            outs = model(x)
        sum(out.float().mean() for out in outs).backward()
    return dict(eval=eval_step, train=train_step)


def dense_steps(model: nn.Module, batch: dict, scope: str):
    """A dense model's inference and training steps, as mmengine's ``val_step`` and ``train_step`` run them."""
    def inference_step(mode):
        def step(autocast):
            model.eval()
            with torch.no_grad(), autocast():
                model(**model.data_preprocessor(batch, False), mode=mode)
        return step

    def train_step(autocast):
        model.train()
        model.zero_grad(set_to_none=True)
        with autocast():
            losses = model(**model.data_preprocessor(batch, True), mode='loss')
        loss, _ = model.parse_losses(losses)
        loss.backward()
    # mmdet pastes masks one detection at a time on CPU: a predict count would measure how many boxes random weights
    # keep, not the network; mmseg's predict is the network and a resize
    inference = 'forward' if scope == 'mmdet' else 'predict'
    return {inference: inference_step('tensor' if inference == 'forward' else 'predict'), 'train': train_step}


def backbone_rows(sizes) -> List[dict]:
    from mala_mm import MALA

    from .backbone import swin_tiny
    models = {'MALA-T': MALA(arch='tiny', impl='triton'), TORCH_PATH: MALA(arch='tiny', impl='torch'),
              'Swin-T': swin_tiny(drop_path_rate=0.2)}
    rows = []
    for name, model in models.items():
        model.init_weights()
        for height, width in sizes:
            torch.manual_seed(0)
            x = torch.randn(1, 3, height, width)
            for mode, step in backbone_steps(model, x).items():
                if name == TORCH_PATH and mode != 'train':
                    continue
                for dtype_name, dtype in AUTOCAST.items():
                    rows.append(dict(model=name, step=f'backbone {width}x{height}', mode=mode, dtype=dtype_name,
                                     **count(model, step, dtype, backbone_part)))
                    print(_summary(rows[-1]), flush=True)
    return rows


def dense_rows(case: str, size) -> List[dict]:
    from .dense_step import build, fake_batch
    ours, swin, dtypes = DENSE[case]
    rows = []
    for name, config, options in (('MALA-T', ours, dict(impl='triton')), (TORCH_PATH, ours, dict(impl='torch')),
                                  ('Swin-T', swin, dict(init_cfg=None))):
        torch.manual_seed(0)
        scope, model = build(config, backbone=options)
        batch = fake_batch(scope, size, torch.device('cpu'), images=2)
        for mode, step in dense_steps(model, batch, scope).items():
            if name == TORCH_PATH and mode != 'train':
                continue
            for dtype_name in dtypes:
                torch.manual_seed(0)
                rows.append(dict(model=name, step=f'{case} 2x{size[1]}x{size[0]}', mode=mode, dtype=dtype_name,
                                 **count(model, step, AUTOCAST[dtype_name], dense_part)))
                print(_summary(rows[-1]), flush=True)
    return rows


def _summary(row: dict) -> str:
    return f"{row['model']} {row['step']} {row['mode']} {row['dtype']}: {row['kernels']} kernels, " \
           f"{row['casts']} casts, {row['bytes'] / 1e9:.2f} GB, {row['saved_bytes'] / MIB:.0f} MiB saved, " \
           f"{row['peak_bytes'] / MIB:.0f} MiB peak; {row['parts']}"


def _by_step(rows: List[dict]) -> Dict[tuple, Dict[str, dict]]:
    pairs = collections.defaultdict(dict)
    for row in rows:
        pairs[row['step'], row['mode'], row['dtype']][row['model']] = row
    return pairs


def ratio_table(rows: List[dict]) -> str:
    """One line per step, mode and dtype: MALA-T's (on its CUDA path) and Swin-T's kernels and bytes and their
    ratios."""
    lines = []
    for (step, mode, dtype), models in _by_step(rows).items():
        ours, swin = models['MALA-T'], models['Swin-T']
        lines.append({'step': step, 'mode': mode, 'dtype': dtype, 'MALA-T kernels': ours['kernels'],
                      'Swin-T kernels': swin['kernels'], 'kernel ratio': ours['kernels'] / swin['kernels'],
                      'MALA-T casts': ours['casts'], 'Swin-T casts': swin['casts'],
                      'MALA-T GB': ours['bytes'] / 1e9, 'Swin-T GB': swin['bytes'] / 1e9,
                      'bytes ratio': ours['bytes'] / swin['bytes']})
    return markdown_table(lines, list(lines[0]))


def memory_table(rows: List[dict]) -> str:
    """One line per training step and dtype: the MiB saved for the backward and the peak MiB held, of MALA-T on its
    CUDA path and on its torch path, of Swin-T, and the ratios to Swin-T's."""
    lines = []
    for (step, mode, dtype), models in _by_step(rows).items():
        if mode != 'train':
            continue
        line = {'step': step, 'dtype': dtype}
        swin = models['Swin-T']
        for measure, key in (('saved', 'saved_bytes'), ('peak', 'peak_bytes')):
            for name in ('MALA-T', TORCH_PATH, 'Swin-T'):
                line[f'{name} {measure} MiB'] = models[name][key] / MIB
            for name in ('MALA-T', TORCH_PATH):
                line[f'{name} {measure} ratio'] = models[name][key] / swin[key]
        lines.append(line)
    return markdown_table(lines, list(lines[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='small inputs: the same backbone counts, in seconds')
    parser.add_argument('--only', nargs='+', choices=['backbone', *DENSE], default=['backbone', *DENSE])
    parser.add_argument('--out', help='results folder (default: results/cpu)')
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    sizes = SIZES['quick' if args.quick else 'full']
    rows = backbone_rows(sizes['backbone']) if 'backbone' in args.only else []
    for case in DENSE:
        if case in args.only:
            rows += dense_rows(case, sizes[case])
    table = ratio_table(rows) + '\n\nMemory of a training step:\n\n' + memory_table(rows)
    print(table)
    name = 'kernel_count_quick' if args.quick else 'kernel_count'
    print(f"written to {write_results(name, torch.device('cpu'), rows, table, args.out)}")


if __name__ == '__main__':
    main()
