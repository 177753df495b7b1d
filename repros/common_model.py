"""A small vLLM-style decoder written from scratch for the break25 repros."""

import torch


@torch.library.custom_op("break25::attn", mutates_args=())
def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return w @ v


@attn.register_fake
def _(q, k, v):
    return torch.empty_like(q)


@torch.library.custom_op("break25::capture", mutates_args=("buf",))
def capture(h: torch.Tensor, buf: torch.Tensor, slot: int) -> None:
    buf[slot, : h.shape[0]].copy_(h)


@capture.register_fake
def _(h, buf, slot):
    return None


class Layer(torch.nn.Module):
    def __init__(self, d, experts=3):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.gate = torch.nn.Linear(d, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(experts))
        self.shared = torch.nn.Sequential(
            torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d)
        )
        self.register_buffer("scale", torch.full((d,), 0.5))

    def forward(self, x):
        h = self.ln1(x)
        a = attn(self.q(h), self.k(h), self.v(h))
        x = x + self.o(a)
        h = self.ln2(x)
        probs = torch.softmax(self.gate(h), dim=-1)
        routed = sum(probs[:, i : i + 1] * e(h) for i, e in enumerate(self.experts))
        return x + routed + self.shared(h) * self.scale


class Model(torch.nn.Module):
    def __init__(self, d=16, layers=2, capture_layers=(0,)):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(d) for _ in range(layers))
        self.capture_layers = capture_layers
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x, buf):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i in self.capture_layers:
                capture(x, buf, self.capture_layers.index(i))
        y = self.norm(x)
        return {"hidden": y, "logits": y.sum(-1)}, (x,)


def inputs(tokens, d=16, slots=1, max_tokens=16):
    torch.manual_seed(tokens)
    return torch.randn(tokens, d), torch.zeros(slots, max_tokens, d)
