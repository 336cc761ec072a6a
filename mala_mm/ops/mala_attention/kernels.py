"""Magnitude-aware linear attention fused into four Triton kernels: two for the forward, two for the backward.

Per batch item and head, with ``phi(x) = elu(x) + 1``, ``s = d^-1/2``, R the RoPE rotation and N tokens, the
unfused :func:`~mala_mm.ops.mala_attention.torch_ops.mala_attention` computes::

    z_i = s phi(q_i) . mean_j phi(k_j),   beta_i = 1 + 1 / (z_i + eps)
    Y_i = beta_i (s / N) R(phi(q_i)) KV - z_i mean_j v_j,   KV = sum_j R(phi(k_j))^T v_j

Forward: :func:`state_kernel` reduces the keys and values of a chunk of tokens to the state ``[KV; sum phi(k);
sum v]``, a (W + 2) x W fp32 matrix per chunk (W: the head width padded to whole blocks), whose chunks one ``sum``
adds; :func:`output_kernel` then turns a tile of queries into their outputs. The backward's two kernels, in
:mod:`.grad_kernels`, use the helpers here. Inputs of any float dtype are read as they are and everything is
computed in fp32 (the matmuls too: ``input_precision='ieee'``), so no rescaling is needed in bf16 or fp16; outputs
take v's dtype, as the torch operators' do.

The head width is split into NUM_BLOCKS blocks of BLOCK_D channels (at least 16, ``tl.dot``'s smallest tile; the
last one masked), and a program holds one BLOCK_D x BLOCK_D block of the d x d state at a time, as
flash-linear-attention tiles its state: a whole 64 x 64 fp32 state and its gradient in one program's registers
spill to local memory on every GPU. Each program takes one axis of the grid (chunks or tiles of one head adjacent),
which has no cap of 65,535 on the heads of a launch. How a call splits its features into tiles and chunks, and the
autograd function that launches the kernels: :mod:`.triton_ops`.
"""
import triton
import triton.language as tl

from ..triton_helpers import TOKEN_ARGS, load_tables, load_tile, rotate, rotate_transposed


@triton.jit
def positive_features(x, valid):
    """elu(x) + 1, and 0 outside the tensor: phi(0) = 1 would count padding as tokens and channels."""
    return tl.where(valid, tl.where(x > 0, x + 1, tl.exp(tl.minimum(x, 0.0))), 0.0)


@triton.jit
def phi_slope(x):
    """The derivative of elu(x) + 1."""
    return tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))


@triton.jit
def features(ptr, stride_n, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims,
             HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tile of q or k: its raw values, phi of them, phi rotated (R(phi) = phi without RoPE) and where it lies
    inside the (N, d) matrix."""
    x, valid = load_tile(ptr, stride_n, rows, cols, num_tokens, head_dims)
    phi = positive_features(x, valid)
    rotated = phi
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        rotated = rotate(phi, cos, sin, BLOCK_N, BLOCK_D)
    return x, phi, rotated, valid


@triton.jit
def rotated_back(g, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims,
                 HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R^T(g) for a tile of the gradient of a rotated tile (g itself without RoPE)."""
    if HAS_ROPE:
        cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        g = rotate_transposed(g, cos, sin, BLOCK_N, BLOCK_D)
    return g


@triton.jit
def block(index, BLOCK_D: tl.constexpr):
    """The channels of block ``index`` of the head width."""
    return index * BLOCK_D + tl.arange(0, BLOCK_D)


@triton.jit
def matrix_block(state, key_block, value_block, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block (key_block, value_block) of the W x W matrix of a (W + 2) x W state, W = NUM_BLOCKS BLOCK_D."""
    return state + block(key_block, BLOCK_D)[:, None] * (NUM_BLOCKS * BLOCK_D) + block(value_block, BLOCK_D)[None, :]


@triton.jit
def vector_block(state, row, index, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block ``index`` of row W + ``row`` of a (W + 2) x W state: the key sum (row 0) or the value sum (row 1)."""
    return state + (NUM_BLOCKS * BLOCK_D + row) * (NUM_BLOCKS * BLOCK_D) + block(index, BLOCK_D)


@triton.jit
def store_block(state, key_block, value_block, matrix, key_vector, value_vector,
                BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block (key_block, value_block) of a state or its gradient: the matrix's, and the vectors' (the key vector's
    block ``key_block``, the value vector's ``value_block``), which every block of a row or column sums alike and
    the first one stores."""
    tl.store(matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS), matrix)
    if value_block == 0:
        tl.store(vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS), key_vector)
    if key_block == 0:
        tl.store(vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS), value_vector)


@triton.jit
def state_size(BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    return (NUM_BLOCKS * BLOCK_D + 2) * (NUM_BLOCKS * BLOCK_D)


@triton.jit
def program(num_parts):
    """The part (chunk or tile of tokens) and the (batch item, head) pair of this program."""
    program = tl.program_id(0)
    return program % num_parts, program // num_parts


@triton.jit
def head(ptr, bh, num_heads, stride_b, stride_h):
    """The (N, d) matrix of head ``bh`` (batch item and head flattened) of a (B, h, N, d) tensor."""
    return ptr + (bh // num_heads) * stride_b + (bh % num_heads) * stride_h


@triton.jit(do_not_specialize=TOKEN_ARGS + ['chunk_tokens', 'num_chunks'])
def state_kernel(k_ptr, v_ptr, cos_ptr, sin_ptr, partial_ptr,
                 stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 num_heads, num_tokens, head_dims, chunk_tokens, num_chunks,
                 HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """partial[bh, chunk] = [sum R(phi(k))^T v; sum phi(k); sum v] over the chunk's tokens."""
    chunk, bh = program(num_chunks)
    k_ptr = head(k_ptr, bh, num_heads, stride_kb, stride_kh)
    v_ptr = head(v_ptr, bh, num_heads, stride_vb, stride_vh)
    partial = partial_ptr + tl.program_id(0) * state_size(BLOCK_D, NUM_BLOCKS)
    for key_block in range(NUM_BLOCKS):
        key_cols = block(key_block, BLOCK_D)
        for value_block in range(NUM_BLOCKS):
            value_cols = block(value_block, BLOCK_D)
            kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
            k_sum = tl.zeros((BLOCK_D,), tl.float32)
            v_sum = tl.zeros((BLOCK_D,), tl.float32)
            for offset in range(0, chunk_tokens, BLOCK_N):
                rows = chunk * chunk_tokens + offset + tl.arange(0, BLOCK_N)
                _, phi_k, rotated_k, _ = features(k_ptr, stride_kn, cos_ptr, sin_ptr, rows, key_cols, num_tokens,
                                                  head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
                v, _ = load_tile(v_ptr, stride_vn, rows, value_cols, num_tokens, head_dims)
                kv += tl.dot(tl.trans(rotated_k), v, input_precision='ieee')
                k_sum += tl.sum(phi_k, 0)
                v_sum += tl.sum(v, 0)
            store_block(partial, key_block, value_block, kv, k_sum, v_sum, BLOCK_D, NUM_BLOCKS)


@triton.jit
def query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """z (before RoPE, as released) and 1 / (z + eps) of a tile of queries; 0 past the last token, where z is 0
    and, with eps = 0, 1 / z would be inf (and 0 * inf NaN)."""
    z = tl.zeros((BLOCK_N,), tl.float32)
    for key_block in range(NUM_BLOCKS):
        cols = block(key_block, BLOCK_D)
        q, valid = load_tile(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
        k_mean = tl.load(vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        z += tl.sum(positive_features(q, valid) * k_mean[None, :], 1)
    z *= scale
    return z, tl.where(rows < num_tokens, 1 / (z + eps), 0.0)


@triton.jit
def query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens, head_dims,
                  HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Block ``value_block`` of R(phi(q)) KV for a tile of queries."""
    product = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    for key_block in range(NUM_BLOCKS):
        _, _, rotated_q, _ = features(q_ptr, stride_qn, cos_ptr, sin_ptr, rows, block(key_block, BLOCK_D),
                                      num_tokens, head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
        kv = tl.load(matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
        product += tl.dot(rotated_q, kv, input_precision='ieee')
    return product


@triton.jit(do_not_specialize=TOKEN_ARGS)
def output_kernel(q_ptr, state_ptr, cos_ptr, sin_ptr, out_ptr,
                  stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
                  num_heads, num_tokens, head_dims, scale, eps,
                  HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_BLOCKS: tl.constexpr):
    """Y = beta (s / N) R(phi(q)) KV - z mean(v) for one tile of queries."""
    tile, bh = program(tl.cdiv(num_tokens, BLOCK_N))
    q_ptr = head(q_ptr, bh, num_heads, stride_qb, stride_qh)
    out_ptr = head(out_ptr, bh, num_heads, stride_ob, stride_oh)
    state = state_ptr + bh * state_size(BLOCK_D, NUM_BLOCKS)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    z, inverse = query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps, BLOCK_N, BLOCK_D,
                             NUM_BLOCKS)
    for value_block in range(NUM_BLOCKS):
        cols = block(value_block, BLOCK_D)
        product = query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens, head_dims,
                                HAS_ROPE, BLOCK_N, BLOCK_D, NUM_BLOCKS)
        v_mean = tl.load(vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        y = ((1 + inverse) * (scale / num_tokens))[:, None] * product - z[:, None] * v_mean[None, :]
        valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
        tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)
