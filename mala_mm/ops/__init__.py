"""The operators the layers run, apart from the modules: each beside what it replaces, and the torch-version shims."""
