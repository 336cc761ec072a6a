"""The backbone's eval time at two git revisions, measured in one run: MALA-T (released layout), fp32, batch 1.

Checks out each revision into a temporary worktree and times them in alternating child processes (A, B, A, B,
...), so that a slow spell of the machine touches both alike; prints the medians and B's speed over A's.

    python -m benchmarks.compare_revisions REV_A [REV_B (default: the working tree)] [--size H W] [--rounds 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

# run with the revision's tree as its working directory and PYTHONPATH: both come before the installed package on
# the child's sys.path ('' of ``python -c`` first), so the child imports the revision's mala_mm
CHILD = '''
import sys, time, torch
from mala_mm import MALA
torch.manual_seed(0)
model = MALA(arch='tiny').eval()
model.init_weights()
x = torch.randn(1, 3, int(sys.argv[1]), int(sys.argv[2]))
with torch.no_grad():
    model(x)
    times = []
    for _ in range(int(sys.argv[3])):
        start = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - start)
print(min(times) * 1e3)
'''


def child_environment(tree: str) -> dict:
    """This process's environment with ``tree`` first on PYTHONPATH."""
    return {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [tree, os.environ.get('PYTHONPATH')]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('rev_a')
    parser.add_argument('rev_b', nargs='?', help='default: the working tree')
    parser.add_argument('--size', type=int, nargs=2, default=[800, 1280], metavar=('H', 'W'))
    parser.add_argument('--rounds', type=int, default=3, help='child processes per revision')
    parser.add_argument('--repeats', type=int, default=3, help='timed forwards per child (the fastest counts)')
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as folder:
        trees = {}
        for name, rev in (('A', args.rev_a), ('B', args.rev_b)):
            if rev is None:
                trees[name] = repo
                continue
            trees[name] = os.path.join(folder, name)
            subprocess.run(['git', '-C', repo, 'worktree', 'add', '--detach', trees[name], rev], check=True,
                           capture_output=True)
        try:
            times = {'A': [], 'B': []}
            for _ in range(args.rounds):
                for name in ('A', 'B'):
                    out = subprocess.run([sys.executable, '-c', CHILD, *map(str, args.size), str(args.repeats)],
                                         cwd=trees[name], env=child_environment(trees[name]),
                                         check=True, capture_output=True, text=True)
                    times[name].append(float(out.stdout.strip().splitlines()[-1]))
        finally:
            for name, tree in trees.items():
                if tree != repo:
                    subprocess.run(['git', '-C', repo, 'worktree', 'remove', '--force', tree], check=False)
    a, b = statistics.median(times['A']), statistics.median(times['B'])
    print(f'A {args.rev_a}: {a:.0f} ms {[round(t) for t in times["A"]]}')
    print(f'B {args.rev_b or "working tree"}: {b:.0f} ms {[round(t) for t in times["B"]]}')
    print(f'B runs {a / b:.2f}x the speed of A (MALA-T eval, {args.size[0]}x{args.size[1]}, fp32)')


if __name__ == '__main__':
    main()
