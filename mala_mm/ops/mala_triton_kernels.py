"""Magnitude-aware linear attention fused into four Triton kernels: two for the forward, two for the backward.

Per batch item and head, with ``phi(x) = elu(x) + 1``, ``s = d^-1/2``, R the RoPE rotation and N tokens, the
unfused :func:`~mala_mm.ops.attention.mala_attention` computes::

    z_i = s phi(q_i) . mean_j phi(k_j),   beta_i = 1 + 1 / (z_i + eps)
    Y_i = beta_i (s / N) R(phi(q_i)) KV - z_i mean_j v_j,   KV = sum_j R(phi(k_j))^T v_j

Forward: :func:`state_kernel` reduces the keys and values of a chunk of tokens to the state ``[KV; sum phi(k);
sum v]``, a (W + 2) x W fp32 matrix per chunk (W: the head width padded to whole blocks), whose chunks one ``sum``
adds; :func:`output_kernel` then turns a tile of queries into their outputs. Backward: :func:`query_grad_kernel`
gives dq and reduces the queries to the gradient of the state; :func:`key_value_grad_kernel` gives dk and dv from
it. Inputs of any float dtype are read as they are and everything is computed in fp32 (the matmuls too:
``input_precision='ieee'``), so no rescaling is needed in bf16 or fp16; outputs take v's dtype, as the unfused
path's do.

The head width is split into NUM_BLOCKS blocks of BLOCK_D channels (at least 16, ``tl.dot``'s smallest tile; the
last one masked), and a program holds one BLOCK_D x BLOCK_D block of the d x d state at a time, as
flash-linear-attention tiles its state: a whole 64 x 64 fp32 state and its gradient in one program's registers
spill to local memory on every GPU. Each program takes one axis of the grid (chunks or tiles of one head adjacent),
which has no cap of 65,535 on the heads of a launch. How a call splits its features into tiles and chunks, and the
autograd function that launches the kernels: :mod:`.mala_triton`.
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
def _features(ptr, stride_n, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims,
              HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tile of q or k: its raw values, phi of them, phi rotated (R(phi) = phi without RoPE) and where it lies
    inside the (N, d) matrix."""
    x, valid = load_tile(ptr, stride_n, rows, cols, num_tokens, head_dims)
    phi = _phi(x, valid)
    rotated = phi
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        rotated = rotate(phi, cos, sin, BLOCK_N, BLOCK_D)
    return x, phi, rotated, valid


@triton.jit
def _rotated_back(g, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims,
                  HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R^T(g) for a tile of the gradient of a rotated tile (g itself without RoPE)."""
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        g = rotate_transposed(g, cos, sin, BLOCK_N, BLOCK_D)
    return g


@triton.jit
def _block(index, BLOCK_D: tl.constexpr):
    """The channels of block ``index`` of the head width."""
    return index * BLOCK_D + tl.arange(0, BLOCK_D)


@triton.jit
def _matrix_block(state, key_block, value_block, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block (key_block, value_block) of the W x W matrix of a (W + 2) x W state, W = NUM_BLOCKS BLOCK_D."""
    return state + _block(key_block, BLOCK_D)[:, None] * (NUM_BLOCKS * BLOCK_D) + _block(value_block, BLOCK_D)[None, :]


@triton.jit
def _vector_block(state, row, index, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block ``index`` of row W + ``row`` of a (W + 2) x W state: the key sum (row 0) or the value sum (row 1)."""
    return state + (NUM_BLOCKS * BLOCK_D + row) * (NUM_BLOCKS * BLOCK_D) + _block(index, BLOCK_D)


@triton.jit
def _store_block(state, key_block, value_block, matrix, key_vector, value_vector,
                 BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block (key_block, value_block) of a state or its gradient: the matrix's, and the vectors' (the key vector's
    block ``key_block``, the value vector's ``value_block``), which every block of a row or column sums alike and
    the first one stores."""
    tl.store(_matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS), matrix)
    if value_block == 0:
        tl.store(_vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS), key_vector)
    if key_block == 0:
        tl.store(_vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS), value_vector)


@triton.jit
def _state_size(BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    return (NUM_BLOCKS * BLOCK_D + 2) * (NUM_BLOCKS * BLOCK_D)


@triton.jit
def _program(num_parts):
    """The part (chunk or tile of tokens) and the (batch item, head) pair of this program."""
    program = tl.program_id(0)
    return program % num_parts, program // num_parts


@triton.jit
def _head(ptr, bh, num_heads, stride_b, stride_h):
    """The (N, d) matrix of head ``bh`` (batch item and head flattened) of a (B, h, N, d) tensor."""
    return ptr + (bh // num_heads) * stride_b + (bh % num_heads) * stride_h


@triton.jit(do_not_specialize=SIZE_ARGS + ['chunk_tokens', 'num_chunks'])
def state_kernel(k_ptr, v_ptr, cos_ptr, sin_ptr, partial_ptr,
                 stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 num_heads, num_tokens, head_dims, chunk_tokens, num_chunks,
                 HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """partial[bh, chunk] = [sum R(phi(k))^T v; sum phi(k); sum v] over the chunk's tokens."""
    chunk, bh = _program(num_chunks)
    k_ptr = _head(k_ptr, bh, num_heads, stride_kb, stride_kh)
    v_ptr = _head(v_ptr, bh, num_heads, stride_vb, stride_vh)
    partial = partial_ptr + tl.program_id(0) * _state_size(BLOCK_D, NUM_BLOCKS)
    for key_block in range(NUM_BLOCKS):
        key_cols = _block(key_block, BLOCK_D)
        for value_block in range(NUM_BLOCKS):
            value_cols = _block(value_block, BLOCK_D)
            kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
            k_sum = tl.zeros((BLOCK_D,), tl.float32)
            v_sum = tl.zeros((BLOCK_D,), tl.float32)
            for offset in range(0, chunk_tokens, BLOCK_N):
                rows = chunk * chunk_tokens + offset + tl.arange(0, BLOCK_N)
                _, phi_k, rotated_k, _ = _features(k_ptr, stride_kn, cos_ptr, sin_ptr, rows, key_cols, num_tokens,
                                                   head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
                v, _ = load_tile(v_ptr, stride_vn, rows, value_cols, num_tokens, head_dims)
                kv += tl.dot(tl.trans(rotated_k), v, input_precision='ieee')
                k_sum += tl.sum(phi_k, 0)
                v_sum += tl.sum(v, 0)
            _store_block(partial, key_block, value_block, kv, k_sum, v_sum, BLOCK_D, NUM_BLOCKS)


@triton.jit
def _query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """z (before RoPE, as released) and 1 / (z + eps) of a tile of queries; 0 past the last token, where z is 0
    and, with eps = 0, 1 / z would be inf (and 0 * inf NaN)."""
    z = tl.zeros((BLOCK_N,), tl.float32)
    for key_block in range(NUM_BLOCKS):
        cols = _block(key_block, BLOCK_D)
        q, valid = load_tile(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
        k_mean = tl.load(_vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        z += tl.sum(_phi(q, valid) * k_mean[None, :], 1)
    z *= scale
    return z, tl.where(rows < num_tokens, 1 / (z + eps), 0.0)


@triton.jit
def _query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens, head_dims,
                   HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block ``value_block`` of R(phi(q)) KV for a tile of queries."""
    product = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    for key_block in range(NUM_BLOCKS):
        _, _, rotated_q, _ = _features(q_ptr, stride_qn, cos_ptr, sin_ptr, rows, _block(key_block, BLOCK_D),
                                       num_tokens, head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
        kv = tl.load(_matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
        product += tl.dot(rotated_q, kv, input_precision='ieee')
    return product


@triton.jit(do_not_specialize=SIZE_ARGS)
def output_kernel(q_ptr, state_ptr, cos_ptr, sin_ptr, out_ptr,
                  stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
                  num_heads, num_tokens, head_dims, scale, eps,
                  HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Y = beta (s / N) R(phi(q)) KV - z mean(v) for one tile of queries."""
    tile, bh = _program(tl.cdiv(num_tokens, BLOCK_N))
    q_ptr = _head(q_ptr, bh, num_heads, stride_qb, stride_qh)
    out_ptr = _head(out_ptr, bh, num_heads, stride_ob, stride_oh)
    state = state_ptr + bh * _state_size(BLOCK_D, NUM_BLOCKS)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    z, inverse = _query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps, BLOCK_N, BLOCK_D,
                              NUM_BLOCKS)
    for value_block in range(NUM_BLOCKS):
        cols = _block(value_block, BLOCK_D)
        product = _query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens, head_dims,
                                 HAS_ROPE, BLOCK_N, BLOCK_D, NUM_BLOCKS)
        v_mean = tl.load(_vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        y = ((1 + inverse) * (scale / num_tokens))[:, None] * product - z[:, None] * v_mean[None, :]
        valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
        tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['chunk_tokens', 'num_chunks'])
def query_grad_kernel(q_ptr, grad_ptr, state_ptr, cos_ptr, sin_ptr, dq_ptr, partial_ptr, terms_ptr,
                      stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn,
                      stride_db, stride_dh, stride_dn,
                      num_heads, num_tokens, head_dims, chunk_tokens, num_chunks, scale, eps,
                      HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      NUM_BLOCKS: tl.constexpr):
    """dq of a chunk of queries, and partial[bh, chunk] = the chunk's share of the gradients of the state:
    [dL/dKV; dL/dmean(phi(k)); dL/dmean(v)].

    Two passes over the chunk, so that a program never holds a block of the state and one of its gradient at once:
    the first gives dq and keeps each query's z and dL/dz in ``terms`` (2 x N fp32 a head); the second sums the
    state's gradient, one block after the other."""
    chunk, bh = _program(num_chunks)
    q_ptr = _head(q_ptr, bh, num_heads, stride_qb, stride_qh)
    grad_ptr = _head(grad_ptr, bh, num_heads, stride_gb, stride_gh)
    dq_ptr = _head(dq_ptr, bh, num_heads, stride_db, stride_dh)
    state = state_ptr + bh * _state_size(BLOCK_D, NUM_BLOCKS)
    terms = terms_ptr + bh * 2 * num_tokens
    kv_scale = scale / num_tokens
    first = chunk * chunk_tokens
    for offset in range(0, chunk_tokens, BLOCK_N):
        rows = first + offset + tl.arange(0, BLOCK_N)
        z, inverse = _query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps, BLOCK_N,
                                  BLOCK_D, NUM_BLOCKS)
        # z enters through beta (d beta / d z = -1 / (z + eps)^2) and through - z mean(v)
        d_z = tl.zeros((BLOCK_N,), tl.float32)
        for value_block in range(NUM_BLOCKS):
            grad, _ = load_tile(grad_ptr, stride_gn, rows, _block(value_block, BLOCK_D), num_tokens, head_dims)
            product = _query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens,
                                     head_dims, HAS_ROPE, BLOCK_N, BLOCK_D, NUM_BLOCKS)
            v_mean = tl.load(_vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
            d_z -= tl.sum(grad * (kv_scale * inverse * inverse)[:, None] * product + grad * v_mean[None, :], 1)
        for key_block in range(NUM_BLOCKS):
            cols = _block(key_block, BLOCK_D)
            d_rotated_q = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
            for value_block in range(NUM_BLOCKS):
                grad, _ = load_tile(grad_ptr, stride_gn, rows, _block(value_block, BLOCK_D), num_tokens, head_dims)
                kv = tl.load(_matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
                d_product = (kv_scale * (1 + inverse))[:, None] * grad
                d_rotated_q += tl.dot(d_product, tl.trans(kv), input_precision='ieee')
            k_mean = tl.load(_vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
            d_phi_q = _rotated_back(d_rotated_q, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims, HAS_ROPE,
                                    BLOCK_N, BLOCK_D) + (scale * d_z)[:, None] * k_mean[None, :]
            q, valid = load_tile(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
            tl.store(dq_ptr + rows[:, None] * stride_dn + cols[None, :],
                     (d_phi_q * _phi_slope(q)).to(dq_ptr.dtype.element_ty), mask=valid)
        in_map = rows < num_tokens
        tl.store(terms + rows, z, mask=in_map)
        tl.store(terms + num_tokens + rows, d_z, mask=in_map)
    tl.debug_barrier()  # the second pass reads z and dL/dz as other threads of the program wrote them
    partial = partial_ptr + tl.program_id(0) * _state_size(BLOCK_D, NUM_BLOCKS)
    for key_block in range(NUM_BLOCKS):
        key_cols = _block(key_block, BLOCK_D)
        for value_block in range(NUM_BLOCKS):
            value_cols = _block(value_block, BLOCK_D)
            d_kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
            d_k_mean = tl.zeros((BLOCK_D,), tl.float32)
            d_v_mean = tl.zeros((BLOCK_D,), tl.float32)
            for offset in range(0, chunk_tokens, BLOCK_N):
                rows = first + offset + tl.arange(0, BLOCK_N)
                in_map = rows < num_tokens
                z = tl.load(terms + rows, mask=in_map, other=0.0)
                d_z = tl.load(terms + num_tokens + rows, mask=in_map, other=0.0)
                inverse = tl.where(in_map, 1 / (z + eps), 0.0)
                _, phi_q, rotated_q, _ = _features(q_ptr, stride_qn, cos_ptr, sin_ptr, rows, key_cols, num_tokens,
                                                   head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
                grad, _ = load_tile(grad_ptr, stride_gn, rows, value_cols, num_tokens, head_dims)
                d_product = (kv_scale * (1 + inverse))[:, None] * grad
                d_kv += tl.dot(tl.trans(rotated_q), d_product, input_precision='ieee')
                d_k_mean += tl.sum((scale * d_z)[:, None] * phi_q, 0)
                d_v_mean -= tl.sum(z[:, None] * grad, 0)
            _store_block(partial, key_block, value_block, d_kv, d_k_mean, d_v_mean, BLOCK_D, NUM_BLOCKS)


@triton.jit(do_not_specialize=SIZE_ARGS)
def key_value_grad_kernel(k_ptr, v_ptr, d_state_ptr, cos_ptr, sin_ptr, dk_ptr, dv_ptr,
                          stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          num_heads, num_tokens, head_dims,
                          HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          NUM_BLOCKS: tl.constexpr):
    """dk and dv of one tile of keys and values from the gradient of the state."""
    tile, bh = _program(tl.cdiv(num_tokens, BLOCK_N))
    k_ptr = _head(k_ptr, bh, num_heads, stride_kb, stride_kh)
    v_ptr = _head(v_ptr, bh, num_heads, stride_vb, stride_vh)
    dk_ptr = _head(dk_ptr, bh, num_heads, stride_dkb, stride_dkh)
    dv_ptr = _head(dv_ptr, bh, num_heads, stride_dvb, stride_dvh)
    d_state = d_state_ptr + bh * _state_size(BLOCK_D, NUM_BLOCKS)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    for key_block in range(NUM_BLOCKS):  # dk = (R^T(v dKV^T) + dL/dmean(phi(k)) / N) phi'(k)
        cols = _block(key_block, BLOCK_D)
        d_rotated_k = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        for value_block in range(NUM_BLOCKS):
            v, _ = load_tile(v_ptr, stride_vn, rows, _block(value_block, BLOCK_D), num_tokens, head_dims)
            d_kv = tl.load(_matrix_block(d_state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
            d_rotated_k += tl.dot(v, tl.trans(d_kv), input_precision='ieee')
        d_k_mean = tl.load(_vector_block(d_state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        d_phi_k = _rotated_back(d_rotated_k, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims, HAS_ROPE,
                                BLOCK_N, BLOCK_D) + d_k_mean[None, :]
        k, valid = load_tile(k_ptr, stride_kn, rows, cols, num_tokens, head_dims)
        tl.store(dk_ptr + rows[:, None] * stride_dkn + cols[None, :],
                 (d_phi_k * _phi_slope(k)).to(dk_ptr.dtype.element_ty), mask=valid)
    for value_block in range(NUM_BLOCKS):  # dv = R(phi(k)) dKV + dL/dmean(v) / N
        cols = _block(value_block, BLOCK_D)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        for key_block in range(NUM_BLOCKS):
            _, _, rotated_k, _ = _features(k_ptr, stride_kn, cos_ptr, sin_ptr, rows, _block(key_block, BLOCK_D),
                                           num_tokens, head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
            d_kv = tl.load(_matrix_block(d_state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
            dv += tl.dot(rotated_k, d_kv, input_precision='ieee')
        dv += (tl.load(_vector_block(d_state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens)[None, :]
        valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
        tl.store(dv_ptr + rows[:, None] * stride_dvn + cols[None, :], dv.to(dv_ptr.dtype.element_ty), mask=valid)
