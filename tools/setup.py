"""mala_tools, the code that the command-line tools, the benchmarks and the tests share: a distribution of its own,
so that the installed plugin, mala_mm, stays the plugin alone. tools/setup_env.sh installs it in editable mode
beside mala_mm (``pip install -e tools``); a tool run as ``python tools/NAME.py`` finds the same files from its own
folder."""
from setuptools import find_packages, setup

setup(
    name='mala_mm_tools',
    version='0.1.0',
    description="mala_mm's tools: config checks, launch checks, model building, bundles, analysis",
    packages=find_packages(include=['mala_tools', 'mala_tools.*']),
    python_requires='>=3.11',
    install_requires=['mala_mm'],
)
