"""The attention formulas: linear-time MALA against its explicit N x N form, and its magnitude awareness."""
import pytest
import torch

from mala_tools import reference
from mala_tools.analysis.attention_scores import score_matrix
from mala_mm.models.layers import MALAttention, RoPE2d, SoftmaxAttention
from mala_mm.ops.mala_attention import mala_attention
from mala_mm.ops.softmax_attention import softmax_attention
from mala_mm.ops.rope import apply_rope

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


@pytest.fixture
def reference_angles():
    """The reference's own RoPE angles of the same map, independent of RoPE2d."""
    return reference.rope_angles(reference.rope_frequencies(D, torch.float64), H, W)


@pytest.mark.parametrize('with_rope', [False, True])
def test_linear_time_mala_equals_explicit_score_matrix(qkv, rope, reference_angles, with_rope):
    q, k, v = qkv
    rope, angles = (rope, reference_angles) if with_rope else (None, None)
    explicit = reference.mala_scores(q, k, angles) @ v
    torch.testing.assert_close(mala_attention(q, k, v, rope), explicit, rtol=1e-10, atol=1e-10)


def test_mala_rows_sum_to_one_without_rope(qkv):
    q, k, _ = qkv
    scores = score_matrix('MALA', q, k, None)
    torch.testing.assert_close(scores, reference.mala_scores(q, k), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(scores.sum(-1), torch.ones(B, HEADS, N, dtype=torch.float64), rtol=0, atol=1e-5)


def test_mala_rows_do_not_sum_to_one_with_rope(qkv, rope):
    # z uses the un-rotated features, as released: the identity holds only when RoPE is the identity.
    q, k, _ = qkv
    row_sums = score_matrix('MALA', q, k, rope).sum(-1)
    assert (row_sums - 1).abs().max() > 1e-3


def test_scaling_phi_q_sharpens_mala_but_not_linear_attention(qkv):
    q, k, _ = qkv
    maxima, spreads, linear_rows = [], [], []
    for factor in (0.5, 1.0, 2.0, 4.0):
        scaled_q = phi_inverse(factor * reference.phi(q))
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


def test_rope_is_a_rotation_by_row_and_column_angles():
    rotation = RoPE2d(D).double().tables(H, W, dtype=torch.float64)
    assert all(t.shape == (N, D) and t.dtype == torch.float64 for t in rotation)
    theta = 1 / 10000 ** torch.linspace(0, 1, D // 4, dtype=torch.float64)
    token = 2 * W + 3                                                       # row 2, column 3
    angles = torch.cat([2 * theta.repeat_interleave(2), 3 * theta.repeat_interleave(2)])
    x = torch.randn(N, D, dtype=torch.float64)
    # RoPE(x) = x * cos + rot(x) * sin, rot: (x_2m, x_2m+1) -> (-x_2m+1, x_2m)
    rot = torch.stack([-x[:, 1::2], x[:, 0::2]], dim=-1).flatten(-2)
    expected = x[token] * angles.cos() + rot[token] * angles.sin()
    torch.testing.assert_close(apply_rope(x, rotation)[token], expected)
    pair_norm = lambda t: t.unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(pair_norm(apply_rope(x, rotation)), pair_norm(x))


def test_rope_tables_are_fp32_for_every_feature_dtype_but_fp64():
    rope = RoPE2d(D)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert all(t.dtype == torch.float32 for t in rope.tables(H, W, dtype))
    assert rope.tables(H, W, torch.float16) is rope.tables(H, W, torch.float32)  # one cached entry


def test_rope_keeps_low_precision_dtypes():
    rotation = RoPE2d(D).tables(H, W, dtype=torch.bfloat16)
    x = torch.randn(2, N, D)
    rotated = apply_rope(x.bfloat16(), rotation)
    assert rotated.dtype == torch.bfloat16
    torch.testing.assert_close(rotated.float(), apply_rope(x, rotation), rtol=2e-2, atol=2e-2)


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
    assert [key[:2] for key in rope._tables] == [(16, 4), (8, 8), (2, 32)]
    assert rope.cached_bytes() == 3 * one_size
    assert rope.tables(64, 64).cos.shape == (64 * 64, 16)  # larger than the bound: computed, not kept
    assert rope.cached_bytes() <= RoPE2d.CACHE_BYTES
