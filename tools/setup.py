"""mala_tools, the code that the command-line tools, the benchmarks and the tests share: a distribution of its own,
so that the installed plugin, mala_mm, stays the plugin alone. tools/setup_env.sh installs it in editable mode
beside mala_mm (``pip install -e tools``); a tool run as ``python tools/NAME.py`` finds the same files from its own
folder."""
import os
import runpy

from setuptools import find_packages, setup

# mala_mm's, read from the checkout this folder is part of (a bundle's source/ is one too), not imported
VERSION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'mala_mm', 'version.py')

setup(
    name='mala_mm_tools',
    version=runpy.run_path(VERSION_FILE)['__version__'],
    description="mala_mm's tools: config checks, launch checks, model building, bundles, analysis",
    packages=find_packages(include=['mala_tools', 'mala_tools.*']),
    python_requires='>=3.8',
    install_requires=['mala_mm'],
)
