"""Magnitude-aware linear attention fused into four Triton kernels: two for the forward, two for the backward.

Per batch item and head, with ``phi(x) = elu(x) + 1``, ``s = d^-1/2``, R the RoPE rotation and N tokens, the
unfused :func:`~mala_mm.models.layers.attention.mala_attention` computes::

    z_i = s phi(q_i) . mean_j phi(k_j),   beta_i = 1 + 1 / (z_i + eps)
    Y_i = beta_i (s / N) R(phi(q_i)) KV - z_i mean_j v_j,   KV = sum_j R(phi(k_j))^T v_j

Forward: :func:`_state_kernel` reduces the keys and values of a chunk of tokens to the state ``[KV; sum phi(k);
sum v]``, a (d + 2) x d fp32 matrix per chunk, whose chunks one ``sum`` adds; :func:`_output_kernel` then turns a
tile of queries into their outputs. Backward: :func:`_query_grad_kernel` gives dq and reduces the queries to the
gradient of the state; :func:`_key_value_grad_kernel` gives dk and dv from it. Inputs of any float dtype are read
as they are and everything is computed in fp32 (the matmuls too: ``input_precision='ieee'``), so no rescaling is
needed in bf16 or fp16; outputs take v's dtype, as the unfused path's do.

Heads narrower than a power of two are padded to one (at least 16, ``tl.dot``'s smallest tile) and masked.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# programs the state reduction aims for, over all chunks, batch items and heads: a few per SM of a large GPU, so
# that one head of 64,000 tokens (MALA-T's first stage at 1333 x 800) spreads over the GPU
TARGET_PROGRAMS = 512


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
def _load(ptr, stride_n, rows, cols, num_tokens, head_dims):
    """A (rows, cols) tile of a (N, d) matrix as fp32, zero outside it, and where it lies inside."""
    valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
    return tl.load(ptr + rows[:, None] * stride_n + cols[None, :], mask=valid, other=0.0).to(tl.float32), valid


@triton.jit
def _load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims):
    """The (rows, cols) tiles of the (N, d) RoPE tables."""
    cos, _ = _load(cos_ptr, head_dims, rows, cols, num_tokens, head_dims)
    sin, _ = _load(sin_ptr, head_dims, rows, cols, num_tokens, head_dims)
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
def _state_kernel(k_ptr, v_ptr, cos_ptr, sin_ptr, partial_ptr,
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
        k, valid = _load(k_ptr, stride_kn, rows, cols, num_tokens, head_dims)
        v, _ = _load(v_ptr, stride_vn, rows, cols, num_tokens, head_dims)
        phi_k = _phi(k, valid)
        k_sum += tl.sum(phi_k, 0)
        v_sum += tl.sum(v, 0)
        if HAS_ROPE:
            cos, sin = _load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
            phi_k = rotate(phi_k, cos, sin, BLOCK_N, BLOCK_D)
        kv += tl.dot(tl.trans(phi_k), v, input_precision='ieee')
    partial = partial_ptr + (bh * tl.num_programs(0) + chunk) * (BLOCK_D + 2) * BLOCK_D
    _store_state(partial, cols, kv, k_sum, v_sum, BLOCK_D)


@triton.jit(do_not_specialize=SIZE_ARGS)
def _output_kernel(q_ptr, state_ptr, cos_ptr, sin_ptr, out_ptr,
                   stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
                   num_heads, num_tokens, head_dims, scale, eps,
                   HAS_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Y = beta (s / N) R(phi(q)) KV - z mean(v) for one tile of queries."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // num_heads, bh % num_heads
    cols = tl.arange(0, BLOCK_D)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    kv, k_sum, v_sum = _load_state(state_ptr + bh * (BLOCK_D + 2) * BLOCK_D, cols, BLOCK_D)
    q, valid = _load(q_ptr + batch * stride_qb + head * stride_qh, stride_qn, rows, cols, num_tokens, head_dims)
    phi_q = _phi(q, valid)
    z = scale * tl.sum(phi_q * (k_sum / num_tokens)[None, :], 1)  # before RoPE, as released
    beta = 1 + 1 / (z + eps)
    if HAS_ROPE:
        cos, sin = _load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
        phi_q = rotate(phi_q, cos, sin, BLOCK_N, BLOCK_D)
    y = (beta * (scale / num_tokens))[:, None] * tl.dot(phi_q, kv, input_precision='ieee')
    y -= z[:, None] * (v_sum / num_tokens)[None, :]
    out_ptr += batch * stride_ob + head * stride_oh
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=SIZE_ARGS + ['chunk_tokens'])
def _query_grad_kernel(q_ptr, grad_ptr, state_ptr, cos_ptr, sin_ptr, dq_ptr, partial_ptr,
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
        q, valid = _load(q_ptr, stride_qn, rows, cols, num_tokens, head_dims)
        grad, _ = _load(grad_ptr, stride_gn, rows, cols, num_tokens, head_dims)
        phi_q = _phi(q, valid)
        z = scale * tl.sum(phi_q * k_mean[None, :], 1)
        inverse = 1 / (z + eps)
        rotated_q = phi_q
        if HAS_ROPE:
            cos, sin = _load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
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
def _key_value_grad_kernel(k_ptr, v_ptr, d_state_ptr, cos_ptr, sin_ptr, dk_ptr, dv_ptr,
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
    k, valid = _load(k_ptr + batch * stride_kb + head * stride_kh, stride_kn, rows, cols, num_tokens, head_dims)
    v, _ = _load(v_ptr + batch * stride_vb + head * stride_vh, stride_vn, rows, cols, num_tokens, head_dims)
    rotated_k = _phi(k, valid)
    if HAS_ROPE:
        cos, sin = _load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
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


# whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 when this module was imported), which runs
# them on CPU tensors
INTERPRETED = not isinstance(_state_kernel, triton.runtime.JITFunction)


def _tiles(head_dims: int) -> Tuple[int, int, dict]:
    """BLOCK_N (tokens a tile), BLOCK_D (padded head width) and the launch options: a d x d fp32 state and its
    gradient stay in registers up to d = 64; wider heads (96 in MALA-B and -L) take half as many tokens a tile,
    twice the warps and no software pipelining: pipelined, the query gradient's kernel asks for 240 KiB of shared
    memory (Triton 3.6, d = 96), more than an H200's 227 KiB."""
    block_d = max(16, triton.next_power_of_2(head_dims))
    if block_d <= 64:
        return 64, block_d, dict(num_warps=4)
    return 32, block_d, dict(num_warps=8, num_stages=1)


def _chunks(num_tokens: int, batch_heads: int, block_n: int) -> Tuple[int, int]:
    """(tokens a chunk, number of chunks) for the reductions over tokens: about TARGET_PROGRAMS programs in all."""
    blocks = triton.cdiv(num_tokens, block_n)
    wanted = max(1, min(blocks, TARGET_PROGRAMS // batch_heads))
    blocks_a_chunk = triton.cdiv(blocks, wanted)
    return blocks_a_chunk * block_n, triton.cdiv(blocks, blocks_a_chunk)


def _strides(t: Tensor) -> Tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def heads_of_channels_last_map(like: Tensor) -> Tensor:
    """An empty (B, h, N, d) tensor like ``like``, laid out as the heads of a channels-last (B, h d, H, W) map: the
    skeleton turns it back into that map without a copy."""
    batch, heads, num_tokens, head_dims = like.shape
    return like.new_empty((batch, num_tokens, heads, head_dims)).transpose(1, 2)


def _unit_stride(t: Tensor) -> Tensor:
    """t, or a copy of it, whose channels are adjacent in memory, as the kernels address them."""
    return t if t.stride(-1) == 1 else t.contiguous()


class _Plan:
    """How the kernels of one call split (B, h, N, d) features: tiles, chunks, grids and launch options."""

    def __init__(self, q: Tensor, cos: Optional[Tensor], sin: Optional[Tensor]):
        batch, self.heads, self.num_tokens, self.head_dims = q.shape
        self.scale = self.head_dims ** -0.5
        block_n, self.block_d, launch = _tiles(self.head_dims)
        self.batch_heads = batch * self.heads
        self.chunk_tokens, self.num_chunks = _chunks(self.num_tokens, self.batch_heads, block_n)
        self.chunk_grid = (self.num_chunks, self.batch_heads)
        self.tile_grid = (triton.cdiv(self.num_tokens, block_n), self.batch_heads)
        self.rope = (cos.contiguous(), sin.contiguous()) if cos is not None else (q, q)  # unread without RoPE
        self.options = dict(HAS_ROPE=cos is not None, BLOCK_N=block_n, BLOCK_D=self.block_d, **launch)
        self._like = q

    def partial_states(self) -> Tensor:
        """Room for each chunk's (d + 2) x d fp32 state."""
        return self._like.new_empty((self.batch_heads, self.num_chunks, self.block_d + 2, self.block_d),
                                    dtype=torch.float32)


class _FusedMALAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], eps: float):
        q, k, v = (_unit_stride(t) for t in (q, k, v))
        plan = _Plan(q, cos, sin)
        partial = plan.partial_states()
        _state_kernel[plan.chunk_grid](k, v, *plan.rope, partial, *_strides(k), *_strides(v), plan.heads,
                                       plan.num_tokens, plan.head_dims, plan.chunk_tokens, **plan.options)
        state = partial.sum(1)
        out = heads_of_channels_last_map(v)
        _output_kernel[plan.tile_grid](q, state, *plan.rope, out, *_strides(q), *_strides(out), plan.heads,
                                       plan.num_tokens, plan.head_dims, plan.scale, eps, **plan.options)
        ctx.save_for_backward(q, k, v, cos, sin, state)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, cos, sin, state = ctx.saved_tensors
        grad = _unit_stride(grad)
        plan = _Plan(q, cos, sin)
        dq, dk, dv = (heads_of_channels_last_map(t) for t in (q, k, v))
        partial = plan.partial_states()
        _query_grad_kernel[plan.chunk_grid](
            q, grad, state, *plan.rope, dq, partial, *_strides(q), *_strides(grad), *_strides(dq), plan.heads,
            plan.num_tokens, plan.head_dims, plan.chunk_tokens, plan.scale, ctx.eps, **plan.options)
        _key_value_grad_kernel[plan.tile_grid](
            k, v, partial.sum(1), *plan.rope, dk, dv, *_strides(k), *_strides(v), *_strides(dk), *_strides(dv),
            plan.heads, plan.num_tokens, plan.head_dims, **plan.options)
        return dq, dk, dv, None, None, None


def fused_mala_attention(q: Tensor, k: Tensor, v: Tensor, rope=None, eps: float = 1e-6) -> Tensor:
    """:func:`~mala_mm.models.layers.attention.mala_attention` in Triton kernels, with the same arguments.

    Args:
        q, k, v: (B, h, N, d) fp32, bf16 or fp16 on one device, any strides (a view of a channels-last map's heads
            is read in place).
        rope: the (N, d) :class:`~mala_mm.models.layers.rope.RotaryTables`, or None.
        eps: keeps ``1 / z`` finite.

    Returns:
        (B, h, N, d) in v's dtype, laid out as the heads of a channels-last map.
    """
    cos, sin = (None, None) if rope is None else rope
    return _FusedMALAttention.apply(q, k, v, cos, sin, eps)
