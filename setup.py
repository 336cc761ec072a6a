import os
import runpy

from setuptools import find_packages, setup

# read, not imported: importing the package imports torch, which a build environment need not have
VERSION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mala_mm', 'version.py')

setup(
    name='mala_mm',
    version=runpy.run_path(VERSION_FILE)['__version__'],
    description='MALA (Magnitude-Aware Linear Attention) backbones for MMDetection and MMSegmentation',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mala_mm', 'mala_mm.*']),
    # the Pythons the setup and the tests ran with (docs/dev/tested_versions.md)
    python_requires='>=3.8',
    classifiers=[
        'Programming Language :: Python :: 3.8',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Programming Language :: Python :: 3.13',
        'Operating System :: POSIX :: Linux',
    ],
    install_requires=[
        # the floor measured (docs/dev/tested_versions.md): torch 2.1, the torch of OpenMMLab's prebuilt
        # mmcv 2.1.0 wheels, so that an existing mmdet 3.x environment keeps its torch
        'torch>=2.1',
        # the tested series; AtomicCheckpointHook relies on CheckpointHook deleting through its file backend
        # (tests/unit/engine/test_atomic_checkpoints.py)
        'mmengine>=0.10.0,<0.11',
        # mmdet 3.3 and mmseg 1.2 assert mmcv < 2.2.0; mmcv is installed first, with its compiled ops,
        # by tools/setup_env.sh (it has no binary wheels on PyPI).
        'mmcv>=2.0.0,<2.2.0',
        'mmdet>=3.0.0,<3.4',
        'mmsegmentation>=1.0.0,<1.3',
        # imported by mmseg without being declared
        'ftfy',
        'regex',
        # mmengine resolves `mmdet::`/`mmseg::` base configs through pkg_resources, which setuptools 82 removed
        # (no floor: an existing environment keeps its setuptools)
        'setuptools<82',
    ],
    extras_require={
        # pytest-xdist: tools/run_tests.sh runs the test files on one worker per core; triton: the fused MALA
        # attention's tests run its kernels in Triton's interpreter where there is no GPU (torch's CPU wheels do not
        # bring Triton; its CUDA wheels pin their own)
        'tests': ['pytest>=7', 'pytest-xdist>=3', 'matplotlib',
                  "triton>=3.2; platform_system == 'Linux' and python_version >= '3.9'"],
        # tools/export_onnx.py: onnxscript is what torch.onnx.export's default (dynamo) exporter needs. On Python
        # 3.8 its last release fails to import (it subscripts collections.UserList), and torch.onnx imports it where
        # it is installed: there the TorchScript exporter serves (--exporter torchscript)
        'deploy': ['onnx>=1.16', 'onnxruntime>=1.18', "onnxscript>=0.2; python_version >= '3.9'"],
    },
)
