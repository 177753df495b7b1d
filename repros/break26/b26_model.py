"""vLLM-style decoder written from scratch for the break26 reproducers: RMSNorm, rotary
embeddings, GQA attention through a custom op (or F.scaled_dot_product_attention), a static
KV cache written with index_copy_, an MoE with top-k routing and index_add_, and captures
through mutates_args custom ops (returning None, returning a tensor, mutating a list)."""

import torch
import torch.nn.functional as F
from torch import nn


@torch.library.custom_op("b26::attn", mutates_args=())
def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=False).contiguous()


@attn.register_fake
def _(q, k, v):
    return q.new_empty(q.shape)


@torch.library.custom_op("b26::capture", mutates_args=("buf",))
def capture(h: torch.Tensor, buf: torch.Tensor) -> None:
    buf.copy_(h)


@capture.register_fake
def _(h, buf):
    return None


@torch.library.custom_op("b26::scale_out", mutates_args=("out",))
def scale_out(x: torch.Tensor, out: torch.Tensor, s: float) -> torch.Tensor:
    out.copy_(x * s)
    return x + 1


@scale_out.register_fake
def _(x, out, s):
    return torch.empty_like(x)


@torch.library.custom_op("b26::write_list", mutates_args=("bufs",))
def write_list(x: torch.Tensor, bufs: list[torch.Tensor]) -> None:
    for i, b in enumerate(bufs):
        b.copy_(x * (i + 1))


@write_list.register_fake
def _(x, bufs):
    return None


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.w.float()).to(x.dtype)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attn(nn.Module):
    def __init__(self, d, heads, kv_heads, max_len, sdpa_op):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.register_buffer("kc", torch.zeros(max_len, kv_heads, self.hd))
        self.register_buffer("vc", torch.zeros(max_len, kv_heads, self.hd))
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        t = torch.arange(max_len).float()
        f = torch.outer(t, inv)
        self.register_buffer("cos", f.cos())
        self.register_buffer("sin", f.sin())
        self.sdpa_op = sdpa_op

    def forward(self, x, pos):
        T = x.shape[0]
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd], -1)
        q = q.view(T, self.h, self.hd)
        k = k.view(T, self.kvh, self.hd)
        v = v.view(T, self.kvh, self.hd)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.kc.index_copy_(0, pos, k.to(self.kc.dtype))
        self.vc.index_copy_(0, pos, v.to(self.vc.dtype))
        L = int(pos.shape[0])  # attend over the written prefix (static)
        kk = self.kc[:L].transpose(0, 1).repeat_interleave(self.h // self.kvh, 0)
        vv = self.vc[:L].transpose(0, 1).repeat_interleave(self.h // self.kvh, 0)
        qq = q.transpose(0, 1)
        if self.sdpa_op:
            o = attn(qq, kk.to(qq.dtype), vv.to(qq.dtype))
        else:
            o = F.scaled_dot_product_attention(qq, kk.to(qq.dtype), vv.to(qq.dtype), is_causal=True)
        return self.o(o.transpose(0, 1).reshape(T, -1))


class MoE(nn.Module):
    def __init__(self, d, experts=4, topk=2):
        super().__init__()
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, 2 * d, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(experts))
        self.shared = nn.Sequential(
            nn.Linear(d, 2 * d, bias=False), nn.SiLU(), nn.Linear(2 * d, d, bias=False)
        )
        self.topk = topk

    def forward(self, x):
        logits = self.gate(x)
        w, idx = torch.topk(logits.softmax(-1), self.topk, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(len(self.w1)):
            # static-shape routing: weight per token for expert e
            we = (w * (idx == e)).sum(-1, keepdim=True)
            g, u = self.w1[e](x).chunk(2, -1)
            y = self.w2[e](F.silu(g) * u) * we
            out.index_add_(0, torch.arange(x.shape[0], device=x.device), y)
        return out + self.shared(x)


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, max_len, sdpa_op):
        super().__init__()
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = Attn(d, heads, kv_heads, max_len, sdpa_op)
        self.moe = MoE(d)

    def forward(self, x, pos):
        x = x + self.attn(self.n1(x), pos)
        return x + self.moe(self.n2(x))


class Model(nn.Module):
    def __init__(
        self, d=32, heads=4, kv_heads=2, layers=2, max_len=16, sdpa_op=True, captures="capture"
    ):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(d, heads, kv_heads, max_len, sdpa_op) for _ in range(layers)
        )
        self.norm = RMSNorm(d)
        self.captures = captures

    def forward(self, x, pos, cap):
        for i, b in enumerate(self.blocks):
            x = b(x, pos)
            if i == 0:
                if self.captures == "capture":
                    capture(x, cap[0, : x.shape[0]])
                elif self.captures == "scale_out":
                    x = scale_out(x, cap[0, : x.shape[0]], 0.5)
                elif self.captures == "list":
                    write_list(x, [cap[0, : x.shape[0]], cap[1, : x.shape[0]]])
        return self.norm(x)
