"""A straightforward implementation of the spec, as the baseline the benchmarks compare against.

Same modules and weights as :class:`mala_mm.MALA`; only the attention is computed the direct way: RoPE tables
rebuilt in every block, channels-last copies and head splits through permute + contiguous, the softmax stages
through an explicit N x N score matrix, and the MALA formula written term by term.
"""
import copy
import types

import torch
import torch.nn.functional as F

from mala_mm import MALA


def rope_tables(angle: torch.Tensor, height: int, width: int):
    rows = torch.arange(height, dtype=angle.dtype, device=angle.device)[:, None] * angle
    cols = torch.arange(width, dtype=angle.dtype, device=angle.device)[:, None] * angle
    angles = torch.cat([rows[:, None, :].expand(-1, width, -1), cols[None, :, :].expand(height, -1, -1)], -1)
    return angles.sin(), angles.cos()  # (H, W, d)


def rotate(x, sin, cos):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return x * cos + torch.stack([-x2, x1], -1).flatten(-2) * sin


def straightforward_attention_forward(self, x, rope):
    b, c, h, w = x.shape
    heads, d = self.num_heads, c // self.num_heads
    qkvo = self.qkvo(x).permute(0, 2, 3, 1).contiguous()                       # b h w 4c
    q, k, v, o = qkvo.chunk(4, dim=-1)
    lepe = self.lepe(v.permute(0, 3, 1, 2).contiguous()).permute(0, 2, 3, 1)  # b h w c
    sin, cos = rope_tables(rope.angle, h, w)                                  # rebuilt in every block

    def heads_first(t):                                                       # b h w (n d) -> b n (h w) d
        return t.reshape(b, h, w, heads, d).permute(0, 3, 1, 2, 4).contiguous()

    q, k, v = heads_first(q), heads_first(k), heads_first(v)                  # b n h w d
    scale = d ** -0.5
    if self.attend.__name__ == 'mala_attention':
        q, k = F.elu(q) + 1, F.elu(k) + 1
        n = h * w
        z = scale * (q.flatten(2, 3) @ k.flatten(2, 3).mean(2, keepdim=True).transpose(-1, -2))
        qr, kr = rotate(q, sin, cos).flatten(2, 3), rotate(k, sin, cos).flatten(2, 3)
        v = v.flatten(2, 3)
        kv = (kr * (scale / n) ** 0.5).transpose(-1, -2) @ (v * (scale / n) ** 0.5)
        y = qr @ kv * (1 + 1 / (z + 1e-6)) - z * v.mean(2, keepdim=True)
    else:
        qr, kr = rotate(q, sin, cos).flatten(2, 3), rotate(k, sin, cos).flatten(2, 3)
        attn = (qr @ kr.transpose(-1, -2) * scale).softmax(-1)                # the N x N matrix
        y = attn @ v.flatten(2, 3)
    y = y.reshape(b, heads, h, w, d).permute(0, 2, 3, 1, 4).reshape(b, h, w, c)
    return self.proj(((y + lepe) * o).permute(0, 3, 1, 2).contiguous())


def straightforward_copy(model: MALA) -> MALA:
    """A copy of ``model`` with the same weights whose attention is computed the straightforward way."""
    baseline = copy.deepcopy(model)
    for stage in baseline.layers:
        for block in stage.blocks:
            block.attn.forward = types.MethodType(straightforward_attention_forward, block.attn)
    return baseline
