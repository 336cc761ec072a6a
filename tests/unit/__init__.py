"""The package, one folder per subpackage of mala_mm/, and the configs: in the test process, with no tool run."""
