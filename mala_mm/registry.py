"""Registration of this package's modules in mmdet's and mmseg's registries."""
import importlib


def register_in_downstream_registries(module_cls) -> None:
    """Register ``module_cls`` in the MODELS registry of mmdet and of mmseg, whichever are installed."""
    for package in ('mmdet', 'mmseg'):
        try:
            registry = importlib.import_module(f'{package}.registry').MODELS
        except ImportError:
            continue
        # module_dict, not registry.get: get() first imports the library's whole model package (every detector
        # and head of mmdet.models, over a second), which building the backbone alone never needs; the library
        # imports it itself when it builds a model from a config
        if registry.module_dict.get(module_cls.__name__) is not module_cls:
            registry.register_module(module=module_cls)
