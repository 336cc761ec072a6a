"""The kernels that code launches, counted in the tests of the Triton operators: each Triton launch by its kernel's
name, and each ATen operator that launches one."""
from torch.utils._python_dispatch import TorchDispatchMode


def patch_launcher(monkeypatch, wrap) -> None:
    """Patches Triton's ``kernel[grid]``, which launches a kernel, with ``wrap(launcher)``: a ``(kernel, grid)``
    function in place of ``launcher``. It is ``KernelInterface.__getitem__``, which the compiled kernels take and,
    from Triton 3.6, the interpreter's; Triton 3.5's interpreter and older ones define their own."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import KernelInterface
    for launching in (KernelInterface, InterpretedFunction):
        if '__getitem__' in vars(launching):
            monkeypatch.setattr(launching, '__getitem__', wrap(vars(launching)['__getitem__']))


def kernel_name_of(kernel) -> str:
    """The name of a Triton kernel: a compiled one's function or the interpreter's."""
    return kernel.fn.__name__ if hasattr(kernel, 'fn') else kernel.__name__


class LaunchRecord(TorchDispatchMode):
    """The kernels that the code under it launches, by name: Triton's, and the ATen operators less the views and
    those that allocate or answer a dtype question, which launch none. The interpreter's own torch calls, while a
    Triton kernel runs, are not counted.

    Args:
        monkeypatch: pytest's, which patches Triton's launcher for the test.
    """

    NO_KERNEL = {'empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided', 'promote_types'}

    def __init__(self, monkeypatch):
        super().__init__()
        self.launches, self._in_kernel = [], False

        def counted(launcher):
            def launcher_of(kernel, grid):
                def launch(*args, **kwargs):
                    self.launches.append(kernel.__name__)
                    self._in_kernel = True
                    try:
                        return launcher(kernel, grid)(*args, **kwargs)
                    finally:
                        self._in_kernel = False
                return launch
            return launcher_of
        patch_launcher(monkeypatch, counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not (self._in_kernel or func.is_view or name in self.NO_KERNEL):
            self.launches.append(f'aten.{name}')
        return func(*args, **(kwargs or {}))

    def take(self):
        """The launches recorded since the last take, and a fresh record."""
        launches, self.launches = self.launches, []
        return launches


def failing_kernel(monkeypatch, kernel_name: str, error=None) -> list:
    """Makes every launch of the Triton kernel ``kernel_name`` raise ``error`` (default: what a kernel that does not
    fit a GPU raises); returns the names of the kernels launched or tried, which the test may read."""
    tried = []

    def failing(launcher):
        def launch(kernel, grid):
            name = kernel_name_of(kernel)
            tried.append(name)
            if name != kernel_name:
                return launcher(kernel, grid)

            def fail(*args, **kwargs):
                raise error or RuntimeError('out of resource: shared memory, Required: 180224, Hardware limit: 101376')
            return fail
        return launch
    patch_launcher(monkeypatch, failing)
    return tried
