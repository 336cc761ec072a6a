"""The operators the layers run, apart from the modules: each in torch operators beside its Triton kernels, with one
function that picks the implementation (:mod:`.dispatch`), and the torch-version shims."""
