"""The backward of magnitude-aware linear attention in two Triton kernels (the forward's and the notation:
:mod:`.kernels`): :func:`query_grad_kernel` gives dq and reduces the queries to the gradient of the state,
:func:`key_value_grad_kernel` gives dk and dv from it."""
import triton
import triton.language as tl

from ..triton_helpers import TOKEN_ARGS, load_tile
from .kernels import (block, features, head, matrix_block, phi_slope, program, query_product, query_terms, rotated_back,
                      state_size, store_block, vector_block)


@triton.jit(do_not_specialize=TOKEN_ARGS + ['chunk_tokens', 'num_chunks'])
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
    chunk, bh = program(num_chunks)
    q_ptr = head(q_ptr, bh, num_heads, stride_qb, stride_qh)
    grad_ptr = head(grad_ptr, bh, num_heads, stride_gb, stride_gh)
    dq_ptr = head(dq_ptr, bh, num_heads, stride_db, stride_dh)
    state = state_ptr + bh * state_size(BLOCK_D, NUM_BLOCKS)
    terms = terms_ptr + bh * 2 * num_tokens
    kv_scale = scale / num_tokens
    first = chunk * chunk_tokens
    for offset in range(0, chunk_tokens, BLOCK_N):
        rows = first + offset + tl.arange(0, BLOCK_N)
        z, inverse = query_terms(q_ptr, stride_qn, state, rows, num_tokens, head_dims, scale, eps, BLOCK_N,
                                 BLOCK_D, NUM_BLOCKS)
        # z enters through beta (d beta / d z = -1 / (z + eps)^2) and through - z mean(v)
        d_z = tl.zeros((BLOCK_N,), tl.float32)
        for value_block in range(NUM_BLOCKS):
            grad, _ = load_tile(grad_ptr, stride_gn, rows, block(value_block, BLOCK_D), num_tokens, head_dims)
            product = query_product(q_ptr, stride_qn, cos_ptr, sin_ptr, state, rows, value_block, num_tokens,
                                    head_dims, HAS_ROPE, BLOCK_N, BLOCK_D, NUM_BLOCKS)
            v_mean = tl.load(vector_block(state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
            d_z -= tl.sum(grad * (kv_scale * inverse * inverse)[:, None] * product + grad * v_mean[None, :], 1)
        for key_block in range(NUM_BLOCKS):
            cols = block(key_block, BLOCK_D)
            d_rotated_q = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
            for value_block in range(NUM_BLOCKS):
                grad, _ = load_tile(grad_ptr, stride_gn, rows, block(value_block, BLOCK_D), num_tokens, head_dims)
                kv = tl.load(matrix_block(state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
                d_product = (kv_scale * (1 + inverse))[:, None] * grad
                d_rotated_q += tl.dot(d_product, tl.trans(kv), input_precision='ieee')
            k_mean = tl.load(vector_block(state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
            d_phi_q = rotated_back(d_rotated_q, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims, HAS_ROPE,
                                   BLOCK_N, BLOCK_D) + (scale * d_z)[:, None] * k_mean[None, :]
            q, valid = load_tile(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
            tl.store(dq_ptr + rows[:, None] * stride_dn + cols[None, :],
                     (d_phi_q * phi_slope(q)).to(dq_ptr.dtype.element_ty), mask=valid)
        in_map = rows < num_tokens
        tl.store(terms + rows, z, mask=in_map)
        tl.store(terms + num_tokens + rows, d_z, mask=in_map)
    tl.debug_barrier()  # the second pass reads z and dL/dz as other threads of the program wrote them
    partial = partial_ptr + tl.program_id(0) * state_size(BLOCK_D, NUM_BLOCKS)
    for key_block in range(NUM_BLOCKS):
        key_cols = block(key_block, BLOCK_D)
        for value_block in range(NUM_BLOCKS):
            value_cols = block(value_block, BLOCK_D)
            d_kv = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
            d_k_mean = tl.zeros((BLOCK_D,), tl.float32)
            d_v_mean = tl.zeros((BLOCK_D,), tl.float32)
            for offset in range(0, chunk_tokens, BLOCK_N):
                rows = first + offset + tl.arange(0, BLOCK_N)
                in_map = rows < num_tokens
                z = tl.load(terms + rows, mask=in_map, other=0.0)
                d_z = tl.load(terms + num_tokens + rows, mask=in_map, other=0.0)
                inverse = tl.where(in_map, 1 / (z + eps), 0.0)
                _, phi_q, rotated_q, _ = features(q_ptr, stride_qn, cos_ptr, sin_ptr, rows, key_cols, num_tokens,
                                                  head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
                grad, _ = load_tile(grad_ptr, stride_gn, rows, value_cols, num_tokens, head_dims)
                d_product = (kv_scale * (1 + inverse))[:, None] * grad
                d_kv += tl.dot(tl.trans(rotated_q), d_product, input_precision='ieee')
                d_k_mean += tl.sum((scale * d_z)[:, None] * phi_q, 0)
                d_v_mean -= tl.sum(z[:, None] * grad, 0)
            store_block(partial, key_block, value_block, d_kv, d_k_mean, d_v_mean, BLOCK_D, NUM_BLOCKS)


@triton.jit(do_not_specialize=TOKEN_ARGS)
def key_value_grad_kernel(k_ptr, v_ptr, d_state_ptr, cos_ptr, sin_ptr, dk_ptr, dv_ptr,
                          stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          num_heads, num_tokens, head_dims,
                          HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          NUM_BLOCKS: tl.constexpr):
    """dk and dv of one tile of keys and values from the gradient of the state."""
    tile, bh = program(tl.cdiv(num_tokens, BLOCK_N))
    k_ptr = head(k_ptr, bh, num_heads, stride_kb, stride_kh)
    v_ptr = head(v_ptr, bh, num_heads, stride_vb, stride_vh)
    dk_ptr = head(dk_ptr, bh, num_heads, stride_dkb, stride_dkh)
    dv_ptr = head(dv_ptr, bh, num_heads, stride_dvb, stride_dvh)
    d_state = d_state_ptr + bh * state_size(BLOCK_D, NUM_BLOCKS)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    for key_block in range(NUM_BLOCKS):  # dk = (R^T(v dKV^T) + dL/dmean(phi(k)) / N) phi'(k)
        cols = block(key_block, BLOCK_D)
        d_rotated_k = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        for value_block in range(NUM_BLOCKS):
            v, _ = load_tile(v_ptr, stride_vn, rows, block(value_block, BLOCK_D), num_tokens, head_dims)
            d_kv = tl.load(matrix_block(d_state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
            d_rotated_k += tl.dot(v, tl.trans(d_kv), input_precision='ieee')
        d_k_mean = tl.load(vector_block(d_state, 0, key_block, BLOCK_D, NUM_BLOCKS)) / num_tokens
        d_phi_k = rotated_back(d_rotated_k, cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims, HAS_ROPE,
                               BLOCK_N, BLOCK_D) + d_k_mean[None, :]
        k, valid = load_tile(k_ptr, stride_kn, rows, cols, num_tokens, head_dims)
        tl.store(dk_ptr + rows[:, None] * stride_dkn + cols[None, :],
                 (d_phi_k * phi_slope(k)).to(dk_ptr.dtype.element_ty), mask=valid)
    for value_block in range(NUM_BLOCKS):  # dv = R(phi(k)) dKV + dL/dmean(v) / N
        cols = block(value_block, BLOCK_D)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        for key_block in range(NUM_BLOCKS):
            _, _, rotated_k, _ = features(k_ptr, stride_kn, cos_ptr, sin_ptr, rows, block(key_block, BLOCK_D),
                                          num_tokens, head_dims, HAS_ROPE, BLOCK_N, BLOCK_D)
            d_kv = tl.load(matrix_block(d_state, key_block, value_block, BLOCK_D, NUM_BLOCKS))
            dv += tl.dot(rotated_k, d_kv, input_precision='ieee')
        dv += (tl.load(vector_block(d_state, 1, value_block, BLOCK_D, NUM_BLOCKS)) / num_tokens)[None, :]
        valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
        tl.store(dv_ptr + rows[:, None] * stride_dvn + cols[None, :], dv.to(dv_ptr.dtype.element_ty), mask=valid)
