"""What the command-line tools in ``tools/`` share, kept beside them and out of the installed ``mala_mm``: one way
to stop on an error, config loading and checks (the heads' classes against the data's among them), one way from a
config to a model (``build_model``, ``build_backbone``), the distributed set-up that also works without CUDA, the
config changes that fit a run to the machine (printed, and in the dumped config), the refusal to run on CPU where
the machine has GPUs, the offline bundle and the README's model-zoo tables; for development, FLOP counts and
what attention attends to (``analysis``) and the spec's MALA written out, the tests' oracle (``reference``).

It is a distribution of its own (tools/setup.py), so that the installed plugin stays the plugin alone:
tools/setup_env.sh installs it in editable mode beside mala_mm, and the benchmarks, the tests and the launchers'
interpreter check (``python -m mala_tools.device``) import it from there; a tool run as ``python tools/NAME.py``
finds the same files from its own folder. Importing the package imports nothing: each tool imports the modules it
uses, the launchers' check only torch.
"""
