"""A straightforward implementation of the spec, as the baseline the benchmarks compare against.

It runs on the parameters of a :class:`mala_mm.MALA` (same weights) but computes every block directly from
the spec, in the default NCHW layout: ``x + DWConv(x)`` as a conv and an add, LayerNorm through permutes, RoPE
tables rebuilt in every block, head splits through permute + contiguous, the MALA formula term by term and the
softmax stages through an explicit N x N score matrix. None of the implementation's own forward code runs,
so its optimisations do not leak into the baseline.
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


def layer_norm(norm, x):
    return norm.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def depthwise(conv, x):
    return F.conv2d(x, conv.weight, conv.bias, padding=conv.kernel_size[0] // 2, groups=conv.groups)


def attention(attn, x, angle):
    b, c, h, w = x.shape
    heads, d = attn.num_heads, c // attn.num_heads
    qkvo = F.conv2d(x, attn.qkvo.weight, attn.qkvo.bias).permute(0, 2, 3, 1).contiguous()  # b h w 4c
    q, k, v, o = qkvo.chunk(4, dim=-1)
    lepe = attn.lepe(v.permute(0, 3, 1, 2).contiguous()).permute(0, 2, 3, 1)  # b h w c
    sin, cos = rope_tables(angle, h, w)                                       # rebuilt in every block

    def heads_first(t):                                                       # b h w (n d) -> b n (h w) d
        return t.reshape(b, h, w, heads, d).permute(0, 3, 1, 2, 4).contiguous()

    q, k, v = heads_first(q), heads_first(k), heads_first(v)                  # b n h w d
    scale = d ** -0.5
    if attn.attend.__name__ == 'mala_attention':
        q, k = F.elu(q) + 1, F.elu(k) + 1
        n = h * w
        z = scale * (q.flatten(2, 3) @ k.flatten(2, 3).mean(2, keepdim=True).transpose(-1, -2))
        qr, kr = rotate(q, sin, cos).flatten(2, 3), rotate(k, sin, cos).flatten(2, 3)
        v = v.flatten(2, 3)
        kv = (kr * (scale / n) ** 0.5).transpose(-1, -2) @ (v * (scale / n) ** 0.5)
        y = qr @ kv * (1 + 1 / (z + 1e-6)) - z * v.mean(2, keepdim=True)
    else:
        qr, kr = rotate(q, sin, cos).flatten(2, 3), rotate(k, sin, cos).flatten(2, 3)
        scores = (qr @ kr.transpose(-1, -2) * scale).softmax(-1)              # the N x N matrix
        y = scores @ v.flatten(2, 3)
    y = y.reshape(b, heads, h, w, d).permute(0, 2, 3, 1, 4).reshape(b, h, w, c)
    return attn.proj(((y + lepe) * o).permute(0, 3, 1, 2).contiguous())


def block_forward(block, x, angle):
    x = x + depthwise(block.pos, x)
    attn = attention(block.attn, layer_norm(block.norm1, x), angle)
    x = x + block.drop_path(attn if block.gamma_1 is None else block.gamma_1 * attn)
    ffn = block.ffn
    hidden = F.gelu(ffn.fc1(layer_norm(block.norm2, x)))
    out = ffn.fc2(hidden + depthwise(ffn.dwconv, hidden))
    return x + block.drop_path(out if block.gamma_2 is None else block.gamma_2 * out)


def backbone_forward(model, x):
    x = model.patch_embed.proj(x)
    outs = []
    for i, stage in enumerate(model.layers):
        for block in stage.blocks:
            x = block_forward(block, x, stage.RoPE.angle)
        if i in model.out_indices:
            outs.append(layer_norm(model.extra_norms[str(i)], x).contiguous())  # NCHW, as RoIAlign reads it
        if stage.downsample is not None:
            x = stage.downsample.norm(stage.downsample.reduction(x))
    return tuple(outs)


def straightforward_copy(model: MALA) -> MALA:
    """A copy of ``model`` with the same weights whose forward is the straightforward one."""
    baseline = copy.deepcopy(model)
    baseline.forward = types.MethodType(backbone_forward, baseline)
    return baseline
