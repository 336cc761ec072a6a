"""The low precisions that the mixed-precision tests run under CPU autocast, as test parameters."""
import pytest
import torch


def cpu_autocast_takes(dtype) -> bool:
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:  # torch 2.1's CPU autocast runs bfloat16 only
        return False


LOW_PRECISIONS = [torch.bfloat16, torch.float16]
NAMES = {torch.bfloat16: 'bf16', torch.float16: 'fp16'}
MARKS = {torch.float16: pytest.mark.skipif(not cpu_autocast_takes(torch.float16),
                                           reason="this torch's CPU autocast has no float16")}
# the low precisions as parameters of a test, each skipped where this torch's CPU autocast lacks it
DTYPES = [pytest.param(dtype, id=NAMES[dtype], marks=MARKS.get(dtype, ())) for dtype in LOW_PRECISIONS]
