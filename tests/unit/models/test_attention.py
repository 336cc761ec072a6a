"""The attention modules and RoPE2d's tables: softmax attention against its explicit form, MALA's magnitude
awareness, and the modules' and the tables' checks."""
import pytest
import torch

from mala_mm.models.layers import MALAttention, RoPE2d, SoftmaxAttention
from mala_mm.ops.mala_attention import naive
from mala_mm.ops.rope import apply_rope
from mala_mm.ops.softmax_attention import softmax_attention
from mala_tools.analysis.attention_scores import score_matrix

B, HEADS, H, W, D = 2, 3, 5, 7, 8
N = H * W


def phi_inverse(p):
    """x with phi(x) = p, for p > 0."""
    return torch.where(p >= 1, p - 1, p.log())


@pytest.fixture
def qkv():
    return [torch.randn(B, HEADS, N, D, dtype=torch.float64) for _ in range(3)]


@pytest.fixture
def rope():
    return RoPE2d(D).double().tables(H, W, dtype=torch.float64)


def test_scaling_phi_q_sharpens_mala_but_not_linear_attention(qkv):
    q, k, _ = qkv
    maxima, spreads, linear_rows = [], [], []
    for factor in (0.5, 1.0, 2.0, 4.0):
        scaled_q = phi_inverse(factor * naive.phi(q))
        scores = score_matrix('MALA', scaled_q, k, None)
        torch.testing.assert_close(scores.sum(-1), torch.ones_like(scores[..., 0]), rtol=0, atol=1e-5)
        maxima.append(scores.max(-1).values)
        spreads.append(scores.std(-1))
        linear_rows.append(score_matrix('linear', scaled_q, k, None))
    for smaller, larger in zip(maxima, maxima[1:]):
        assert (larger > smaller).all()
    for smaller, larger in zip(spreads, spreads[1:]):
        assert (larger > smaller).all()
    for rows in linear_rows[1:]:
        torch.testing.assert_close(rows, linear_rows[0], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(linear_rows[0].sum(-1), torch.ones_like(linear_rows[0][..., 0]))


def test_softmax_attention_equals_explicit_softmax(qkv, rope):
    q, k, v = qkv
    rq, rk = apply_rope(q, rope), apply_rope(k, rope)
    explicit = torch.softmax(rq @ rk.transpose(-2, -1) * D ** -0.5, dim=-1) @ v
    torch.testing.assert_close(softmax_attention(q, k, v, rope), explicit)


def test_rope_tables_are_fp32_for_every_feature_dtype_but_fp64():
    rope = RoPE2d(D)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert all(t.dtype == torch.float32 for t in rope.tables(H, W, dtype))
    assert rope.tables(H, W, torch.float16) is rope.tables(H, W, torch.float32)  # one cached entry


@pytest.mark.parametrize('module_cls', [MALAttention, SoftmaxAttention])
def test_attention_modules_work_on_their_own(module_cls):
    channels, heads = 32, 2
    attn = module_cls(channels, heads)
    x = torch.randn(2, channels, 9, 11)
    y = attn(x, RoPE2d(channels // heads).tables(9, 11))
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


@pytest.mark.parametrize('channels,heads,message', [(30, 4, 'do not divide'), (24, 4, 'multiple of 4')])
def test_attention_rejects_bad_head_layout(channels, heads, message):
    with pytest.raises(ValueError, match=message):
        MALAttention(channels, heads)


def test_rope_rejects_a_head_width_not_a_multiple_of_4():
    with pytest.raises(ValueError, match='RoPE2d: the head width 6 must be a multiple of 4 for 2-D RoPE'):
        RoPE2d(6)


def test_rope_tables_keep_the_recently_used_sizes_within_the_memory_bound(monkeypatch):
    rope = RoPE2d(16)
    one_size = 2 * 8 * 8 * 16 * 4  # cos and sin of 64 tokens x 16 dims in fp32
    monkeypatch.setattr(RoPE2d, 'CACHE_BYTES', 3 * one_size)
    first = rope.tables(8, 8)
    rope.tables(4, 16)
    rope.tables(16, 4)
    assert rope.tables(8, 8) is first  # a hit moves the size to the back of the queue
    rope.tables(2, 32)  # over the bound: the least recently used size, (4, 16), goes
    assert [key[:2] for key, _ in rope.cached_tables()] == [(16, 4), (8, 8), (2, 32)]
    assert rope.cached_bytes() == 3 * one_size
    assert rope.tables(64, 64).cos.shape == (64 * 64, 16)  # larger than the bound: computed, not kept
    assert rope.cached_bytes() <= RoPE2d.CACHE_BYTES
