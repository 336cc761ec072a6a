"""The operators the layers run, apart from the modules. The attention, RoPE's rotation, the depth-wise convs with
their neighbours and the residual branches each run in torch operators or in Triton kernels, one function choosing
(:mod:`.dispatch`; the launchers' shared parts in :mod:`.triton_launch`); the convolution, the weight casts and the
torch-version shims run in torch operators."""
