"""Decode every image of a config's dataset splits and list those that cannot be decoded
(``python -m mala_mm.cli.check_dataset --help``)."""
from mala_mm.cli import tool_main
from mala_mm.cli.check_dataset import main

if __name__ == '__main__':
    tool_main(main)
