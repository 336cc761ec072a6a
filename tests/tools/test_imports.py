"""mala_mm's imports, read from the source: no circles, and none from a layer to one above it (ops below models;
inside ops, the plain references and the Triton kernels apart from the rest)."""
import ast
import os
from typing import Dict, Set

from tests.helpers import ROOT

PACKAGE = os.path.join(ROOT, 'mala_mm')

# what each part of the package may import from the package's other parts
OTHER_PARTS_ALLOWED = {
    'mala_mm.ops': set(),
    'mala_mm.checkpoint': set(),
    'mala_mm.models': {'mala_mm.ops', 'mala_mm.checkpoint'},
    'mala_mm.datasets': set(),
    'mala_mm.engine': set(),
    'mala_mm.export': {'mala_mm.sample_inputs'},
}
KERNEL_MODULES = ('kernels', 'grad_kernels', 'triton_helpers')


def module_files() -> Dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith('.py'):
                path = os.path.join(folder, file)
                name = os.path.relpath(path[:-3], ROOT).replace(os.sep, '.')
                found[name[:-len('.__init__')] if name.endswith('.__init__') else name] = path
    return found


def imports(modules: Dict[str, str]) -> Dict[str, Set[str]]:
    """Each module's imports of the package's modules (a name imported from a package counts as its submodule
    where it is one)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith('__init__.py') else name.rsplit('.', 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = package.split('.')
                    base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                targets.update(f'{base}.{alias.name}' for alias in node.names)
        graph[name] = set()
        for target in targets:
            while target and target not in modules:
                target = target.rpartition('.')[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def part(name: str) -> str:
    return '.'.join(name.split('.')[:2])


def test_no_module_imports_in_a_circle():
    graph = imports(module_files())
    # an import of a package runs its __init__, which may import its own modules: those edges are no circle
    graph = {name: {t for t in targets if not name.startswith(t + '.')} for name, targets in graph.items()}
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError('import circle: ' + ' -> '.join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for target in sorted(graph[name]):
            visit(target)
        path.pop()
        done.add(name)
    for name in sorted(graph):
        visit(name)


def test_no_module_imports_a_layer_above_it():
    graph = imports(module_files())
    wrong = []
    for name, targets in graph.items():
        for target in targets:
            if part(target) != part(name) and part(target) not in OTHER_PARTS_ALLOWED.get(part(name), {part(target)}):
                wrong.append(f'{name} imports {target}')
            leaf, target_leaf = name.rsplit('.', 1)[-1], target.rsplit('.', 1)[-1]
            if leaf == 'naive' and target_leaf != 'naive':
                wrong.append(f'{name} (a plain reference) imports {target}')
            if leaf in KERNEL_MODULES and target_leaf not in KERNEL_MODULES:
                wrong.append(f'{name} (Triton kernels) imports {target}')
    assert not wrong, '\n'.join(sorted(wrong))
