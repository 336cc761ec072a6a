"""Registration of this package's modules in mmdet's and mmseg's registries."""
import importlib


def register_in_downstream_registries(module_cls) -> None:
    """Register ``module_cls`` in the MODELS registry of mmdet and of mmseg, whichever are installed."""
    for package in ('mmdet', 'mmseg'):
        try:
            registry = importlib.import_module(f'{package}.registry').MODELS
        except ImportError:
            continue
        if registry.get(module_cls.__name__) is not module_cls:
            registry.register_module(module=module_cls)
