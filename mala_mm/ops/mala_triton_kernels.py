"""Magnitude-aware linear attention fused into four Triton kernels: two for the forward, two for the backward.

Per batch item and head, with ``phi(x) = elu(x) + 1``, ``s = d^-1/2``, R the RoPE rotation and N tokens, the
unfused :func:`~mala_mm.ops.attention.mala_attention` computes::

    z_i = s phi(q_i) . mean_j phi(k_j),   beta_i = 1 + 1 / (z_i + eps)
    Y_i = beta_i (s / N) R(phi(q_i)) KV - z_i mean_j v_j,   KV = sum_j R(phi(k_j))^T v_j

Forward: :func:`state_kernel` reduces the keys and values of a chunk of tokens to the state ``[KV; sum phi(k);
sum v]``, a (d + 2) x d fp32 matrix per chunk, whose chunks one ``sum`` adds; :func:`output_kernel` then turns a
tile of queries into their outputs. Backward: :func:`query_grad_kernel` gives dq and reduces the queries to the
gradient of the state; :func:`key_value_grad_kernel` gives dk and dv from it. Inputs of any float dtype are read
as they are and everything is computed in fp32 (the matmuls too: ``input_precision='ieee'``), so no rescaling is
needed in bf16 or fp16; outputs take v's dtype, as the unfused path's do.

Heads narrower than a power of two are padded to one (at least 16, ``tl.dot``'s smallest tile) and masked. How a
call splits its features into tiles and chunks, and the autograd function that launches the kernels:
:mod:`.mala_triton`.
"""
import triton
import triton.language as tl

# Triton compiles a kernel again where an integer argument moves between 1, multiples of 16 and other values; the
# number of tokens changes with every image size, so it is passed as a plain runtime value
SIZE_ARGS = ['num_tokens']


@triton.jit
def _phi(x, valid):
    """elu(x) + 1, and 0 outside the tensor: phi(0) = 1 would count padding as tokens and channels."""
    return tl.where(valid, tl.where(x > 0, x + 1, tl.exp(tl.minimum(x, 0.0))), 0.0)


@triton.jit
def _phi_slope(x):
    """The derivative of elu(x) + 1."""
    return tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))


@triton.jit
def swap_pairs(x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each channel pair (x_2m, x_2m+1) of a (BLOCK_N, BLOCK_D) tile as (x_2m+1, x_2m)."""
    even, odd = tl.split(tl.reshape(x, (BLOCK_N, BLOCK_D // 2, 2)))
    return tl.reshape(tl.join(odd, even), (BLOCK_N, BLOCK_D))


@triton.jit
def rotate(x, cos, sin, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R(x) = x cos + swap(x) sin, with sin sign-folded as in RotaryTables."""
    return x * cos + swap_pairs(x, BLOCK_N, BLOCK_D) * sin


@triton.jit
def rotate_transposed(g, cos, sin, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R^T(g) = g cos - swap(g) sin: a pair's two sines differ only in sign."""
    return g * cos - swap_pairs(g, BLOCK_N, BLOCK_D) * sin


@triton.jit
def load_tile(ptr, stride_n, rows, cols, num_tokens, head_dims):
    """A (rows, cols) tile of a (N, d) matrix as fp32, zero outside it, and where it lies inside."""
    valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
    return tl.load(ptr + rows[:, None] * stride_n + cols[None, :], mask=valid, other=0.0).to(tl.float32), valid


@triton.jit
def load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims):
    """The (rows, cols) tiles of the (N, d) RoPE tables."""
    cos, _ = load_tile(cos_ptr, head_dims, rows, cols, num_tokens, head_dims)
    sin, _ = load_tile(sin_ptr, head_dims, rows, cols, num_tokens, head_dims)
    return cos, sin


@triton.jit
def _load_state(ptr, cols, BLOCK_D: tl.constexpr):
    """A (BLOCK_D + 2, BLOCK_D) state: the d x d matrix and its two row vectors."""
    matrix = tl.load(ptr + cols[:, None] * BLOCK_D + cols[None, :])
    return matrix, tl.load(ptr + BLOCK_D * BLOCK_D + cols), tl.load(ptr + (BLOCK_D + 1) * BLOCK_D + cols)


@triton.jit
def _store_state(ptr, cols, matrix, first, second, BLOCK_D: tl.constexpr):
    tl.store(ptr + cols[:, None] * BLOCK_D + cols[None, :], matrix)
    tl.store(ptr + BLOCK_D * BLOCK_D + cols, first)
    tl.store(ptr + (BLOCK_D + 1) * BLOCK_D + cols, second)


@triton.jit(do_not_specialize=SIZE_ARGS + ['chunk_tokens'])
def state_kernel(k_ptr, v_ptr, cos_ptr, sin_ptr, partial_ptr,
                 stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 num_heads, num_tokens, head_dims, chunk_tokens,
                 HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """partial[bh, chunk] = [sum R(phi(k))^T v; sum phi(k); sum v] over the chunk's tokens."""
    chunk, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // num_heads, bh % num_heads
    k_ptr += batch * stride_kb + head * stride_kh
    v_ptr += batch * stride_vb + head * stride_vh
    cols = tl.arange(0, BLOCK_D)
    kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
    k_sum = tl.zeros((BLOCK_D,), tl.float32)
    v_sum = tl.zeros((BLOCK_D,), tl.float32)
    for offset in range(0, chunk_tokens, BLOCK_N):
        rows = chunk * chunk_tokens + offset + tl.arange(0, BLOCK_N)
        k, valid = load_tile(k_ptr, stride_kn, rows, cols, num_tokens, head_dims)
        v, _ = load_tile(v_ptr, stride_vn, rows, cols, num_tokens, head_dims)
        phi_k = _phi(k, valid)
        k_sum += tl.sum(phi_k, 0)
        v_sum += tl.sum(v, 0)
        if HAS_ROPE:
            cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
            phi_k = rotate(phi_k, cos, sin, BLOCK_N, BLOCK_D)
        kv += tl.dot(tl.trans(phi_k), v, input_precision='ieee')
    partial = partial_ptr + (bh * tl.num_programs(0) + chunk) * (BLOCK_D + 2) * BLOCK_D
    _store_state(partial, cols, kv, k_sum, v_sum, BLOCK_D)


@triton.jit(do_not_specialize=SIZE_ARGS)
def output_kernel(q_ptr, state_ptr, cos_ptr, sin_ptr, out_ptr,
                  stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
                  num_heads, num_tokens, head_dims, scale, eps,
                  HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Y = beta (s / N) R(phi(q)) KV - z mean(v) for one tile of queries."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // num_heads, bh % num_heads
    cols = tl.arange(0, BLOCK_D)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    kv, k_sum, v_sum = _load_state(state_ptr + bh * (BLOCK_D + 2) * BLOCK_D, cols, BLOCK_D)
    q, valid = load_tile(q_ptr + batch * stride_qb + head * stride_qh, stride_qn, rows, cols, num_tokens, head_dims)
    phi_q = _phi(q, valid)
    z = scale * tl.sum(phi_q * (k_sum / num_tokens)[None, :], 1)  # before RoPE, as released
    beta = 1 + 1 / (z + eps)
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        phi_q = rotate(phi_q, cos, sin, BLOCK_N, BLOCK_D)
    y = (beta * (scale / num_tokens))[:, None] * tl.dot(phi_q, kv, input_precision='ieee')
    y -= z[:, None] * (v_sum / num_tokens)[None, :]
    out_ptr += batch * stride_ob + head * stride_oh
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['chunk_tokens'])
def query_grad_kernel(q_ptr, grad_ptr, state_ptr, cos_ptr, sin_ptr, dq_ptr, partial_ptr,
                      stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn,
                      stride_db, stride_dh, stride_dn,
                      num_heads, num_tokens, head_dims, chunk_tokens, scale, eps,
                      HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dq of a chunk of queries, and partial[bh, chunk] = the chunk's share of the gradients of the state:
    [dL/dKV; dL/dmean(phi(k)); dL/dmean(v)]."""
    chunk, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // num_heads, bh % num_heads
    q_ptr += batch * stride_qb + head * stride_qh
    grad_ptr += batch * stride_gb + head * stride_gh
    dq_ptr += batch * stride_db + head * stride_dh
    cols = tl.arange(0, BLOCK_D)
    kv, k_sum, v_sum = _load_state(state_ptr + bh * (BLOCK_D + 2) * BLOCK_D, cols, BLOCK_D)
    k_mean, v_mean = k_sum / num_tokens, v_sum / num_tokens
    kv_scale = scale / num_tokens
    d_kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
    d_k_mean = tl.zeros((BLOCK_D,), tl.float32)
    d_v_mean = tl.zeros((BLOCK_D,), tl.float32)
    for offset in range(0, chunk_tokens, BLOCK_N):
        rows = chunk * chunk_tokens + offset + tl.arange(0, BLOCK_N)
        q, valid = load_tile(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
        grad, _ = load_tile(grad_ptr, stride_gn, rows, cols, num_tokens, head_dims)
        phi_q = _phi(q, valid)
        z = scale * tl.sum(phi_q * k_mean[None, :], 1)
        inverse = 1 / (z + eps)
        rotated_q = phi_q
        if HAS_ROPE:
            cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
            rotated_q = rotate(phi_q, cos, sin, BLOCK_N, BLOCK_D)
        product = tl.dot(rotated_q, kv, input_precision='ieee')                       # R(phi(q)) KV
        d_product = (kv_scale * (1 + inverse))[:, None] * grad
        # z enters through beta (d beta / d z = -1 / (z + eps)^2) and through - z mean(v)
        d_z = -kv_scale * tl.sum(grad * product, 1) * inverse * inverse - tl.sum(grad * v_mean[None, :], 1)
        d_rotated_q = tl.dot(d_product, tl.trans(kv), input_precision='ieee')
        d_phi_q = d_rotated_q
        if HAS_ROPE:
            d_phi_q = rotate_transposed(d_rotated_q, cos, sin, BLOCK_N, BLOCK_D)
        d_phi_q += (scale * d_z)[:, None] * k_mean[None, :]
        dq = d_phi_q * _phi_slope(q)
        tl.store(dq_ptr + rows[:, None] * stride_dn + cols[None, :], dq.to(dq_ptr.dtype.element_ty), mask=valid)
        d_kv += tl.dot(tl.trans(rotated_q), d_product, input_precision='ieee')
        d_k_mean += tl.sum((scale * d_z)[:, None] * phi_q, 0)
        d_v_mean -= tl.sum(z[:, None] * grad, 0)
    partial = partial_ptr + (bh * tl.num_programs(0) + chunk) * (BLOCK_D + 2) * BLOCK_D
    _store_state(partial, cols, d_kv, d_k_mean, d_v_mean, BLOCK_D)


@triton.jit(do_not_specialize=SIZE_ARGS)
def key_value_grad_kernel(k_ptr, v_ptr, d_state_ptr, cos_ptr, sin_ptr, dk_ptr, dv_ptr,
                          stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          num_heads, num_tokens, head_dims,
                          HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dk and dv of one tile of keys and values from the gradient of the state."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // num_heads, bh % num_heads
    cols = tl.arange(0, BLOCK_D)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    d_kv, d_k_mean, d_v_mean = _load_state(d_state_ptr + bh * (BLOCK_D + 2) * BLOCK_D, cols, BLOCK_D)
    k, valid = load_tile(k_ptr + batch * stride_kb + head * stride_kh, stride_kn, rows, cols, num_tokens, head_dims)
    v, _ = load_tile(v_ptr + batch * stride_vb + head * stride_vh, stride_vn, rows, cols, num_tokens, head_dims)
    rotated_k = _phi(k, valid)
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        rotated_k = rotate(rotated_k, cos, sin, BLOCK_N, BLOCK_D)
    d_rotated_k = tl.dot(v, tl.trans(d_kv), input_precision='ieee')
    dv = tl.dot(rotated_k, d_kv, input_precision='ieee') + (d_v_mean / num_tokens)[None, :]
    d_phi_k = d_rotated_k
    if HAS_ROPE:
        d_phi_k = rotate_transposed(d_rotated_k, cos, sin, BLOCK_N, BLOCK_D)
    dk = (d_phi_k + (d_k_mean / num_tokens)[None, :]) * _phi_slope(k)
    dk_ptr += batch * stride_dkb + head * stride_dkh
    dv_ptr += batch * stride_dvb + head * stride_dvh
    tl.store(dk_ptr + rows[:, None] * stride_dkn + cols[None, :], dk.to(dk_ptr.dtype.element_ty), mask=valid)
    tl.store(dv_ptr + rows[:, None] * stride_dvn + cols[None, :], dv.to(dv_ptr.dtype.element_ty), mask=valid)
