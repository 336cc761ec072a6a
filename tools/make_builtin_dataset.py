"""Generate the built-in shapes dataset used by the *_builtin configs
(``python -m mala_mm.cli.make_builtin_dataset --help``)."""
from mala_mm.cli import tool_main
from mala_mm.cli.make_builtin_dataset import main

if __name__ == '__main__':
    tool_main(main)
