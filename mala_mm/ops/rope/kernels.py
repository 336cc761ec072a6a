"""RoPE's rotation of the softmax stages' q and k in one Triton kernel: in the forward, a tile of q's and k's heads
rotated in place in the qkvo projection's map (R); in the backward, their gradients rotated back (R^T, the rotation
being linear) and v's and o's copied beside them, into the map's gradient."""
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


@triton.jit
def copy_tile(x_ptr, out_ptr, rows, cols, stride_xn, stride_on, num_tokens, head_dims):
    x, valid = load_tile(x_ptr, stride_xn, rows, cols, num_tokens, head_dims)
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], x.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=TOKEN_ARGS)
def rotate_qk_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, v_out_ptr, o_out_ptr,
                     stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                     stride_outb, stride_outh, stride_outn,
                     num_heads, num_tokens, head_dims,
                     TRANSPOSED: tl.constexpr, COPY_VO: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """R (or R^T) of one tile of q's and of k's heads (B, h, N, d), and where COPY_VO v's and o's tiles copied; the
    four outputs have the strides stride_out*. One axis of programs, the tiles of a head adjacent."""
    tiles = tl.cdiv(num_tokens, BLOCK_N)
    block, bh = tl.program_id(0) % tiles, tl.program_id(0) // tiles
    batch, head = bh // num_heads, bh % num_heads
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
    out = batch * stride_outb + head * stride_outh
    # in place, each program reads its tile whole before it writes it
    rotate_tile(q_ptr + batch * stride_qb + head * stride_qh, q_out_ptr + out, cos, sin, rows, cols,
                stride_qn, stride_outn, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)
    rotate_tile(k_ptr + batch * stride_kb + head * stride_kh, k_out_ptr + out, cos, sin, rows, cols,
                stride_kn, stride_outn, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)
    if COPY_VO:
        copy_tile(v_ptr + batch * stride_vb + head * stride_vh, v_out_ptr + out, rows, cols, stride_vn, stride_outn,
                  num_tokens, head_dims)
        copy_tile(o_ptr + batch * stride_ob + head * stride_oh, o_out_ptr + out, rows, cols, stride_on, stride_outn,
                  num_tokens, head_dims)
