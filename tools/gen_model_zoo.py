"""Render README.md's model-zoo and variant tables from model-index.yml and MALA.arch_zoo
(``python tools/gen_model_zoo.py --help``; the logic is tools/mala_tools/model_zoo.py)."""
from pathlib import Path

from mala_tools.errors import tool_main
from mala_tools.model_zoo import main

if __name__ == '__main__':
    tool_main(lambda: main(repo=Path(__file__).resolve().parents[1]))
