"""Objects whose pickles call code when loaded, for the tests of what checkpoint loading refuses."""
import numpy as np


class WritesAFile:
    """Pickles as ``open(path, 'w')``: loading it creates the file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


class LooksUpAMethod:
    """Pickles as ``getattr(numpy.ndarray, 'tofile')``."""

    def __reduce__(self):
        return (getattr, (np.ndarray, 'tofile'))


class Calls:
    """Pickles as ``function(*args)``, optionally followed by ``__setstate__(state)``."""

    def __init__(self, function, args, state=None):
        self.reduced = (function, args) if state is None else (function, args, state)

    def __reduce__(self):
        return self.reduced
