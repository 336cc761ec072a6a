"""Make an offline bundle: what the stack needs beyond torch, for a machine with no package index.

Run where PyPI is reachable, in the tested environment (.venv after tools/setup_env.sh), whose versions the
bundle pins. On the offline machine, in an environment that has torch: ``bash BUNDLE/install.sh``
(docs/offline_gpu_check.md).

Examples:
    python tools/make_bundle.py --python 3.12 --out mala_mm_bundle_cp312
    python tools/make_bundle.py --python 3.12 --out mala_mm_bundle_cp312 --leave-out numpy scipy opencv-python
    # with mmcv prebuilt for the node (its CUDA ops built without a GPU: docs/offline_gpu_check.md)
    python tools/make_bundle.py --python 3.12 --out mala_mm_bundle_cp312 \
        --mmcv-wheel mmcv-2.1.0-cp312-cp312-linux_x86_64.whl
"""
import argparse

from mala_tools.bundle import DEFAULT_PLATFORMS, folder_mib, make_bundle
from mala_tools.errors import tool_main


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--python', required=True, help="the offline machine's Python, major.minor (e.g. 3.12)")
    parser.add_argument('--out', required=True, help='a new or empty folder')
    parser.add_argument('--platform', nargs='+', default=list(DEFAULT_PLATFORMS),
                        help="pip's platform tags of the offline machine (default: manylinux x86_64)")
    parser.add_argument('--leave-out', nargs='+', default=[], metavar='PACKAGE',
                        help='packages the offline environment already has (e.g. numpy scipy opencv-python); '
                             'the install stops, naming them, where it lacks one')
    parser.add_argument('--mmcv-wheel', metavar='WHEEL',
                        help="a prebuilt mmcv wheel for the node's torch and Python, which the install takes "
                             'instead of building mmcv (minutes to hours) where it works there')
    args = parser.parse_args()
    manifest = make_bundle(args.out, args.python, args.platform, args.leave_out, args.mmcv_wheel)
    left_out = ', '.join(manifest['left_out']) or 'nothing'
    prebuilt = f" and {manifest['mmcv_wheel']}" if manifest['mmcv_wheel'] else ''
    print(f"{args.out}: {len(manifest['bundled'])} packages, mmcv {manifest['mmcv']}'s source{prebuilt}, mala_mm and "
          f"mala_tools for Python {args.python}, {folder_mib(args.out):.1f} MiB; left out: {left_out}")


if __name__ == '__main__':
    tool_main(main)
