"""What the command-line tools in ``tools/`` share, kept beside them and out of the installed ``mala_mm``: one way
to stop on an error, config loading and checks (the heads' classes against the data's among them), one way from a
config to a model (``build_model``, ``build_backbone``), the distributed set-up that also works without CUDA, the
config changes that fit a run to the machine (printed, and in the dumped config), the refusal to run on CPU where
the machine has GPUs, the offline bundle and the README's model-zoo tables; for development, FLOP counts and
what attention attends to (``analysis``) and the spec's MALA written out, the tests' oracle (``reference``).

A tool run as ``python tools/NAME.py`` finds this package because Python puts the script's folder first on
``sys.path``; the tests have ``tools`` on theirs (pytest.ini). Importing the package imports nothing: each tool
imports the modules it uses, and the launchers' interpreter check (``python -m mala_tools.device``) only torch.
"""
