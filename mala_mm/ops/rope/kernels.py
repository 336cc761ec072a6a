"""RoPE's rotation of a tile of q and the same tile of k in one Triton kernel, forward (R) and backward (R^T, the
rotation being linear)."""
import triton
import triton.language as tl

from ..triton_helpers import TOKEN_ARGS, load_tables, load_tile, rotate, rotate_transposed


@triton.jit
def rotate_tile(x_ptr, out_ptr, cos, sin, rows, cols, stride_xn, stride_on, num_tokens, head_dims,
                TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    x, valid = load_tile(x_ptr, stride_xn, rows, cols, num_tokens, head_dims)
    if TRANSPOSED:
        y = rotate_transposed(x, cos, sin, BLOCK_N, BLOCK_D)
    else:
        y = rotate(x, cos, sin, BLOCK_N, BLOCK_D)
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=TOKEN_ARGS)
def rotate_pair_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                       stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                       stride_ob, stride_oh, stride_on,
                       num_heads, num_tokens, head_dims,
                       TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R (or R^T) of one tile of q and of k; both outputs have the strides stride_o*. One axis of programs, the
    tiles of a head adjacent."""
    tiles = tl.cdiv(num_tokens, BLOCK_N)
    block, bh = tl.program_id(0) % tiles, tl.program_id(0) // tiles
    batch, head = bh // num_heads, bh % num_heads
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
    out = batch * stride_ob + head * stride_oh
    rotate_tile(q_ptr + batch * stride_qb + head * stride_qh, q_out_ptr + out, cos, sin, rows, cols,
                stride_qn, stride_on, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)
    rotate_tile(k_ptr + batch * stride_kb + head * stride_kh, k_out_ptr + out, cos, sin, rows, cols,
                stride_kn, stride_on, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)
