"""The test suite (tools/run_tests.sh; docs/dev/testing.md): unit tests of the package and the configs in unit/,
the tools in tools/, multi-process end-to-end runs in e2e/; what they share in helpers/."""
