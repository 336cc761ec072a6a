"""The version of mala_mm and of its tools' distribution (setup.py, tools/setup.py read it from this file without
importing the package; CITATION.cff repeats it, tests/tools/test_install.py holds them together)."""
__version__ = '0.1.0'
