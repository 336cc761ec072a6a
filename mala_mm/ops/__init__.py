"""The operators the layers run, apart from the modules, laid out one package per operator as
flash-linear-attention lays out its ops: ``naive`` (the plain formula, every test's reference), ``torch_ops`` (the
torch operators that the CPU, compiled, traced and exported graphs run), ``triton_ops`` (the autograd function and
launcher) and ``kernels`` (the Triton kernels); the package's function picks the implementation
(:mod:`.dispatch`).

- :mod:`.mala_attention`: magnitude-aware linear attention;
- :mod:`.rope`: RoPE's rotation of the softmax stages' q and k;
- :mod:`.depthwise`: the depth-wise convs with their residual, GELU or gate;
- :mod:`.residual`: the residual branches with their layer scale, stochastic depth and the LayerNorm after them;
- :mod:`.batch_norm_gelu`: the stem's BatchNorms and GELUs in training.

:data:`OPERATORS` lists them for tools and tests: each one's reference, implementations and kernel variants.
Softmax attention (:mod:`.softmax_attention`), the convolution (:mod:`.conv2d`), the weight casts and the torch
shims run in torch operators only; the Triton launchers share :mod:`.triton_launch` and :mod:`.triton_helpers`.
"""
from .batch_norm_gelu import BATCH_NORM_GELU
from .depthwise import GATED_DEPTHWISE_CONV, RESIDUAL_DEPTHWISE_CONV
from .dispatch import IMPLS, TRITON_AVAILABLE, Operator
from .mala_attention import MALA_ATTENTION
from .residual import SCALED_RESIDUAL, SCALED_RESIDUAL_NORM
from .rope import ROTATE_QK

OPERATORS = {operator.name: operator for operator in (MALA_ATTENTION, ROTATE_QK, RESIDUAL_DEPTHWISE_CONV,
                                                      GATED_DEPTHWISE_CONV, SCALED_RESIDUAL, SCALED_RESIDUAL_NORM,
                                                      BATCH_NORM_GELU)}

__all__ = ['IMPLS', 'OPERATORS', 'TRITON_AVAILABLE', 'Operator']
