"""The soundness corpus: small models written the way model code is, each with a hidden write.

Every `Case` is an ``nn.Module`` factory plus example inputs.  Each model has two independent
branches, so that a schedule on 2 or 3 streams really uses more than one stream: a chain of
matmuls (`tower`) on one side, and on the other a storage that is read, written in place by
some construct of real model code (a KV-cache update through ``self.k_cache``, an in-place
activation module, ``out=``, a view then an in-place method, a custom op, a user module
that updates its own buffer, random numbers, ...), then read again.  A scheduler that does
not see the write may move a read across it; `tests.msched.test_soundness` checks that
msched does not, through ``torch.fx.symbolic_trace`` and through ``torch.compile``.

Models are built with a fixed seed (`build`), so two builds hold the same weights.

``torch.fx.symbolic_trace`` evaluates, at trace time, any expression that involves no traced
value (``self.buf * 2`` becomes a constant, ``self.buf.mul_(2)`` runs once while tracing), so
every read and write of a buffer here involves an input or a parameter; the test checks
first that the traced module computes what the eager model does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import msched

D = 8  # every hidden size

__all__ = ["CASES", "Case", "build", "fx_trace"]


@dataclass(frozen=True)
class Case:
    """One model of the corpus.

    ``model`` builds the module (called under a fixed seed by `build`); ``inputs`` makes
    fresh example inputs (deterministic).  ``leaves`` are user module types that
    ``torch.fx`` keeps as ``call_module`` nodes instead of tracing through them.  ``random``
    cases draw random numbers: every run is seeded the same.  ``no_fx`` / ``no_dynamo``
    give the reason a front end cannot express the case faithfully (the case is skipped
    there).
    """

    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Tensor, ...]]
    leaves: tuple[type[nn.Module], ...] = ()
    random: bool = False
    no_fx: str | None = None
    no_dynamo: str | None = None


def build(case: Case) -> nn.Module:
    """``case.model()`` under a fixed seed, with frozen parameters (inference)."""
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        model = case.model()
    return model.requires_grad_(False)


class _Tracer(torch.fx.Tracer):
    def __init__(self, leaves: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, module_qualified_name)


def fx_trace(model: nn.Module, leaves: tuple[type[nn.Module], ...] = ()) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace(model)``, keeping instances of ``leaves`` as call_module."""
    if not leaves:
        return torch.fx.symbolic_trace(model)
    tracer = _Tracer(leaves)
    graph = tracer.trace(model)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


def _randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _xy() -> tuple[Tensor, Tensor]:
    return _randn(D, D, seed=1), _randn(D, D, seed=2)


def tower(h: Tensor, w: Tensor, depth: int = 3) -> Tensor:
    """The heavy independent branch: a chain of matmuls (the critical path)."""
    for _ in range(depth):
        h = torch.tanh(h @ w)
    return h


class _Hazard(nn.Module):
    """Base of the simple cases: ``tower(y)`` next to ``read x; write x; read x``.

    Subclasses implement `write` (an in-place update of ``x`` by the construct under test).
    ``forward`` returns the tower, a read of ``x`` taken before the write and one after.
    """

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def write(self, x: Tensor, y: Tensor) -> None:
        raise NotImplementedError

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = torch.cos(x) @ self.w  # must read x as it was passed in
        self.write(x, y)
        after = torch.sin(x) @ self.w  # must read x as written
        return side, before, after


def _hazard(name: str, write: Callable[[Tensor, Tensor], object], **kw: object) -> Case:
    """A `_Hazard` case whose write is ``write(x, y)`` (a lambda over real model code)."""
    cls = type(f"Hazard_{name}", (_Hazard,), {"write": lambda self, x, y: write(x, y)})
    return Case(name, cls, _xy, **kw)  # type: ignore[arg-type]


# --- KV cache ------------------------------------------------------------------------------


class KVCacheAttention(nn.Module):
    """Decode step of one attention layer with a static KV cache held in buffers.

    The cache is written with ``index_copy_`` through ``self.k_cache`` / ``self.v_cache``
    and read by SDPA through further accesses of the same attributes (``symbolic_trace``
    makes one ``get_attr`` node per access).
    """

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.register_buffer("k_cache", torch.randn(1, 6, D))
        self.register_buffer("v_cache", torch.randn(1, 6, D))

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        self.k_cache.index_copy_(1, pos, k)
        self.v_cache.index_copy_(1, pos, v)
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        return self.o_proj(out)


def _kv_inputs() -> tuple[Tensor, Tensor]:
    return _randn(1, 2, D, seed=3), torch.tensor([1, 4])


class KVCacheSetitem(nn.Module):
    """Like `KVCacheAttention`, writing the cache with ``cache[:, pos] = k``."""

    def __init__(self) -> None:
        super().__init__()
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.register_buffer("k_cache", torch.randn(1, 6, D))
        self.register_buffer("v_cache", torch.randn(1, 6, D))

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        old = self.v_cache.sum(1)  # read the cache before the update
        k, v = self.k_proj(x), self.v_proj(x)
        self.k_cache[:, pos] = k
        self.v_cache[:, pos] = v
        return F.scaled_dot_product_attention(x, self.k_cache, self.v_cache) + old


# --- tied weights and buffers --------------------------------------------------------------


class TiedEmbeddingMaxNorm(nn.Module):
    """LM head tied to an embedding with ``max_norm``: the lookup renormalises rows of the
    shared weight in place, between a read through the head and a later one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, D, max_norm=1.0)
        self.embed.weight.data.mul_(3.0)  # rows longer than max_norm: the lookup rescales them
        self.head = nn.Linear(D, 16, bias=False)
        self.head.weight = self.embed.weight
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, ids: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(h, self.w)
        early = self.head(h)  # the weight before the renorm
        e = self.embed(ids)  # renormalises the looked-up rows in place
        late = self.head(e)  # the renormalised weight
        return side, early, late


class TiedFunctionalEmbedding(nn.Module):
    """The same with ``F.embedding(ids, weight, max_norm=...)`` and ``F.linear``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, D) * 3.0)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, ids: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(h, self.w)
        early = F.linear(h, self.weight)
        e = F.embedding(ids, self.weight, max_norm=1.0)
        late = F.linear(e, self.weight)
        return side, early, late


def _ids_h() -> tuple[Tensor, Tensor]:
    return torch.tensor([0, 3, 3, 7, 9, 2, 0, 15]), _randn(D, D, seed=4)


class BufferUpdatedInPlace(nn.Module):
    """A running mean updated with ``self.mean.add_(...)``, read before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.randn(D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = (x - self.mean) @ self.w
        self.mean.add_(x.mean(0))
        after = (x - self.mean) @ self.w
        return side, before, after


class TiedBufferAndParameter(nn.Module):
    """One tensor registered under two names (``self.a`` and ``self.b``), written through
    one name and read through the other."""

    def __init__(self) -> None:
        super().__init__()
        shared = torch.randn(D, D)
        self.register_buffer("a", shared)
        self.register_buffer("b", shared)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.b @ self.w
        self.a.mul_(x)
        after = self.b @ self.w
        return side, before, after


# --- functions and modules msched does not know ---------------------------------------------


def scale_rows_(x: Tensor, factor: float) -> None:
    """A helper that updates its argument in place (``torch.fx.wrap``: one opaque node)."""
    x.mul_(factor)


torch.fx.wrap("scale_rows_")


class WrappedFunction(_Hazard):
    def write(self, x: Tensor, y: Tensor) -> None:
        scale_rows_(x, 2.0)


@torch.library.custom_op("msched_soundness::inplace_slice_copy", mutates_args=("dest",))
def inplace_slice_copy(dest: Tensor, src: Tensor, start: int, end: int) -> None:
    """The Eagle3 capture: ``dest[:, start:end] = src``, returns nothing."""
    dest[:, start:end].copy_(src)


@inplace_slice_copy.register_fake
def _(dest: Tensor, src: Tensor, start: int, end: int) -> None:
    return None


class Eagle3Capture(nn.Module):
    """Three layers; the hidden states of layers 0 and 2 are captured into ``hidden`` (an
    input), which a draft head reads at the end; the head also reads it before."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(3))
        self.draft = nn.Linear(2 * D, D)

    def forward(self, x: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        stale = self.draft(hidden)  # the buffer as passed in
        h = x
        for i, layer in enumerate(self.layers):
            h = torch.tanh(layer(h))
            if i in (0, 2):
                j = 0 if i == 0 else 1
                torch.ops.msched_soundness.inplace_slice_copy(hidden, h, j * D, (j + 1) * D)
        return h, stale, self.draft(hidden)


def _capture_inputs() -> tuple[Tensor, Tensor]:
    return _randn(D, D, seed=5), _randn(D, 2 * D, seed=6)


@torch.library.custom_op("msched_soundness::add_into_all", mutates_args=("caches",))
def add_into_all(caches: list[Tensor], src: Tensor) -> None:
    """Adds ``src`` into every tensor of a list (a list argument, ``Tensor(a!)[]``)."""
    for cache in caches:
        cache.add_(src)


@add_into_all.register_fake
def _(caches: list[Tensor], src: Tensor) -> None:
    return None


class CustomOpWritesAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.randn(D, D))
        self.register_buffer("v_cache", torch.randn(D, D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.v_cache @ self.w
        torch.ops.msched_soundness.add_into_all([self.k_cache, self.v_cache], x)
        return side, before, self.v_cache @ self.w


@torch.library.custom_op("msched_soundness::opaque_copy", mutates_args="unknown")
def opaque_copy(dest: Tensor, src: Tensor) -> None:
    """``mutates_args="unknown"``: every tensor argument may be written."""
    dest.copy_(src)


@opaque_copy.register_fake
def _(dest: Tensor, src: Tensor) -> None:
    return None


def first_row(x: Tensor) -> Tensor:
    """A helper that returns a view of its argument (``torch.fx.wrap``: one opaque node)."""
    return x[0]


torch.fx.wrap("first_row")


@torch.library.custom_op("msched_soundness::undeclared_copy", mutates_args=())
def undeclared_copy(dest: Tensor, src: Tensor) -> Tensor:
    """Writes ``dest`` without declaring it (``mutates_args=()``); msched learns of it from
    `msched.register_mutation`.  Returns a fresh tensor, which the model uses."""
    dest.copy_(src)
    return src.sum(0)


@undeclared_copy.register_fake
def _(dest: Tensor, src: Tensor) -> Tensor:
    return src.sum(0)


msched.register_mutation(torch.ops.msched_soundness.undeclared_copy, "dest")


class RegisteredMutation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = torch.cos(x) @ self.w
        total = torch.ops.msched_soundness.undeclared_copy(x, y * 0.5)
        return side, before, torch.sin(x) @ self.w + total


class RunningStat(nn.Module):
    """A user module (kept as ``call_module``) that updates its own buffer in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.randn(D))

    def forward(self, x: Tensor) -> Tensor:
        self.mean.mul_(0.5).add_(x.mean(0), alpha=0.5)
        return x - self.mean


class UserModuleUpdatesItsBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stat = RunningStat()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.stat.mean @ self.w  # get_attr stat.mean
        centred = self.stat(x)  # call_module stat: writes stat.mean
        after = self.stat.mean @ self.w  # get_attr stat.mean again
        return side, before, centred, after


class ClampInPlace(nn.Module):
    """A user module (kept as ``call_module``) that clamps its input in place."""

    def forward(self, x: Tensor) -> Tensor:
        return x.clamp_(-0.5, 0.5)


class UserModuleMutatesItsInput(_Hazard):
    def __init__(self) -> None:
        super().__init__()
        self.clamp = ClampInPlace()

    def write(self, x: Tensor, y: Tensor) -> None:
        self.clamp(x)


class BatchNormTrain(nn.Module):
    """``nn.BatchNorm1d`` in training mode updates its running stats, read before/after."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(D)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.bn.running_mean @ self.w
        normed = self.bn(x)
        after = self.bn.running_mean @ self.w
        return side, before, normed, after


class FunctionalBatchNorm(nn.Module):
    """``F.batch_norm(..., training=True)`` updates the running-stat buffers it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(D))
        self.register_buffer("running_var", torch.ones(D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.running_mean @ self.w
        normed = F.batch_norm(x, self.running_mean, self.running_var, training=True)
        after = self.running_mean @ self.w
        return side, before, normed, after


class TiedLinears(nn.Module):
    """Two ``nn.Linear`` sharing one weight; it is scaled in place through one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, D, bias=False)
        self.down = nn.Linear(D, D, bias=False)
        self.down.weight = self.up.weight
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.down(x)
        self.up.weight.T.mul_(x.mean())  # through getattr(..., "T") of the other name
        return side, before, self.down(x)


class CacheViewAttributes(nn.Module):
    """``self.k_cache`` / ``self.v_cache`` are plain attributes that view one ``kv_cache``
    buffer (as engines that allocate one KV block per layer do)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kv_cache", torch.randn(2, D, D))
        self.k_cache = self.kv_cache[0]
        self.v_cache = self.kv_cache[1]
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.v_cache @ self.w
        self.kv_cache.mul_(x.mean())
        scores = (x @ self.k_cache).softmax(-1)
        return side, before, scores @ self.v_cache


class BufferViewOfBuffer(nn.Module):
    """Buffer ``tail`` is a view of the second half of buffer ``block`` (a KV block and a
    layer's slot in it); the block is written, the slot read."""

    def __init__(self) -> None:
        super().__init__()
        block = torch.randn(2 * D, D)
        self.register_buffer("block", block)
        self.register_buffer("tail", block[D:])
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.tail @ self.w
        self.block[D:].mul_(x)
        return side, before, self.tail @ self.w


class SubmoduleBufferTied(nn.Module):
    """The parent registers a user submodule's buffer under a name of its own; the submodule
    (kept as ``call_module``) updates it, the parent reads it by its own name."""

    def __init__(self) -> None:
        super().__init__()
        self.stat = RunningStat()
        self.register_buffer("mean", self.stat.mean)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.w @ self.mean
        centred = self.stat(x)
        return side, before, centred, self.w @ self.mean


class LoRAMerge(nn.Module):
    """A LoRA delta merged into ``self.proj.weight`` in place between two calls of
    ``self.proj`` (an ``nn.Linear``, which reads its weight without a ``get_attr`` node)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.lora_a = nn.Parameter(torch.randn(2, D))
        self.lora_b = nn.Parameter(torch.randn(D, 2))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.proj(x)
        self.proj.weight.add_(self.lora_b @ self.lora_a)
        return side, before, self.proj(x)


class EvalBatchNormStatsUpdated(nn.Module):
    """An eval-mode ``nn.BatchNorm1d`` whose running mean is recalibrated in place between
    two calls (the module reads its buffers without ``get_attr`` nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(D).eval()
        self.bn.running_mean.normal_()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.bn(x)
        self.bn.running_mean.copy_(x.mean(0))
        return side, before, self.bn(x) @ self.w


class ForeachEMA(nn.Module):
    """Two EMA buffers decayed together with ``torch._foreach_mul_`` (a list argument)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ema_a", torch.randn(D, D))
        self.register_buffer("ema_b", torch.randn(D, D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.ema_b @ self.w
        torch._foreach_mul_([self.ema_a, self.ema_b], y.mean())
        torch._foreach_add_([self.ema_a, self.ema_b], [x, x])
        return side, before, self.ema_b @ self.w


class BatchNormByAten(nn.Module):
    """``torch.batch_norm(..., training=True, ...)`` called positionally, as code ported from
    TorchScript does: it updates the running stats, which its aten schema does not declare."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(D) + 0.5)
        self.beta = nn.Parameter(torch.randn(D))
        self.register_buffer("mu", torch.randn(D))
        self.register_buffer("var", torch.rand(D) + 0.5)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.mu @ self.w + self.var @ self.w
        normed = torch.batch_norm(
            x, self.gamma, self.beta, self.mu, self.var, True, 0.1, 1e-5, False
        )
        after = self.w @ self.mu + self.w @ self.var
        return side, before, normed, after


class InstanceNormTrackedStats(nn.Module):
    """``torch.instance_norm(use_input_stats=True)`` with running stats (what
    ``nn.InstanceNorm1d(track_running_stats=True)`` lowers to): the stats are updated in
    place, undeclared by the aten schema; an EMA of them is read before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stat_mean", torch.zeros(D))
        self.register_buffer("stat_var", torch.ones(D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.w @ self.stat_var
        normed = torch.instance_norm(
            x[None], None, None, self.stat_mean, self.stat_var,
            use_input_stats=True, momentum=0.3, eps=1e-5, cudnn_enabled=False,
        )  # fmt: skip
        after = self.stat_mean @ self.w + self.w @ self.stat_var
        return side, before, normed[0], after


class HiddenStateCaptureHook(nn.Module):
    """Eagle3-style capture with ``register_forward_hook``: a hook on one decoder layer (an
    ``nn.Linear``) copies its output into the ``aux_hidden`` buffer, which the draft head
    reads before (last step's states) and after the layer ran."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(2))
        self.register_buffer("aux_hidden", torch.randn(D, D))
        self.draft = nn.Linear(D, D, bias=False)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)
        self.layers[1].register_forward_hook(self._capture)

    def _capture(self, module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        self.aux_hidden.copy_(output)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        stale = self.draft(self.aux_hidden)
        h = x
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return side, stale, h, self.draft(self.aux_hidden)


class CalibrationPreHook(nn.Module):
    """An activation observer (quantisation calibration) as a forward *pre*-hook on an
    ``nn.Linear``: it folds the input's absolute maximum into the ``amax`` buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.register_buffer("amax", torch.rand(D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)
        self.proj.register_forward_pre_hook(self._observe)

    def _observe(self, module: nn.Module, args: tuple[Tensor, ...]) -> None:
        self.amax.copy_(torch.maximum(self.amax, args[0].abs().amax(0)))

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = self.w @ self.amax
        out = self.proj(x)
        return side, before, out, self.amax @ self.w


class SpectralNormDiscriminator(nn.Module):
    """A GAN discriminator with ``spectral_norm(nn.Linear)`` in training mode, applied to a
    real batch and to a generated one: each call's pre-hook runs a power iteration step
    that updates ``weight_u`` in place, so the second call sees the first call's update."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.utils.spectral_norm(nn.Linear(D, D))
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, noise: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        fake = tower(noise, self.w)
        return self.critic(real), self.critic(fake)


class PagedAttentionLayer(nn.Module):
    """vLLM-style attention: the engine binds the KV cache as a plain attribute list
    (``self.kv_cache = [cache]``), not a buffer; the layer writes the new keys into their
    slots in place.  Kept as ``call_module`` (``leaves=``)."""

    def __init__(self, cache: Tensor) -> None:
        super().__init__()
        self.kv_cache = [cache]

    def forward(self, k: Tensor, slots: Tensor) -> Tensor:
        cache = self.kv_cache[0]
        cache.index_copy_(0, slots, k)
        return (k @ cache.T).softmax(-1) @ cache


class EngineBoundKVCache(nn.Module):
    """The parent owns the cache as a buffer and hands it to its attention layer; it reads
    the cache through the buffer before and after the layer wrote it (the write waits for
    the matmul tower that computes the keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kv_cache", torch.randn(D, D))
        self.attn = PagedAttentionLayer(self.kv_cache)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor, slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        before = self.kv_cache @ self.w  # the cache as the last step left it
        h = tower(x, self.w)  # the layer's hidden states: the keys come late
        out = self.attn(self.k_proj(h[:2]), slots)
        return before, out, self.w @ self.kv_cache + y


def _xy_slots() -> tuple[Tensor, Tensor, Tensor]:
    return _randn(D, D, seed=10), _randn(D, D, seed=11), torch.tensor([5, 2])


class NarrowKeywordKVCache(nn.Module):
    """A preallocated KV cache handed in by the engine, written with
    ``torch.narrow(input=cache, ...).copy_(k)`` (the tensor passed by keyword), then read
    by attention; the previous step's cache is read before the write."""

    def __init__(self) -> None:
        super().__init__()
        self.k_proj = nn.Linear(D, D, bias=False)
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor, k_cache: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        old = k_cache.sum(0)
        k = self.k_proj(x[:3])
        torch.narrow(input=k_cache, dim=0, start=4, length=3).copy_(k)
        scores = (x @ k_cache.T).softmax(-1)
        return side, old, scores @ k_cache


# --- random numbers -----------------------------------------------------------------------


class DropoutAndNoise(nn.Module):
    """``F.dropout`` on one branch, ``torch.rand_like`` on another: with a fixed seed the
    numbers depend on the order the two draw in."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        a = tower(x, self.w)
        b = F.dropout(y, 0.5, training=True)
        c = F.dropout(a, 0.5, training=True)
        return b, c + torch.rand_like(x)


class DropoutModules(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)
        self.drop_a = nn.Dropout(0.5)
        self.drop_b = nn.Dropout(0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        a = tower(x, self.w)
        return self.drop_b(y) + torch.randn_like(y), self.drop_a(a)


class Sampling(nn.Module):
    """Token sampling: ``torch.multinomial`` on one branch, exponential (Gumbel-style) noise
    drawn in place with ``Tensor.exponential_`` on another."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        probs = tower(x, self.w).softmax(-1)
        picked = torch.multinomial(probs, 2)
        noise = torch.empty_like(y).exponential_()
        return picked, (y.softmax(-1) / noise).argmax(-1)


class AttentionDropout(nn.Module):
    """``F.scaled_dot_product_attention(dropout_p=0.5)`` draws random numbers too."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        a = tower(x, self.w)
        q = y[None]
        attn = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        return attn, a + torch.rand_like(a)


class InplaceDropoutModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)
        self.drop = nn.Dropout(0.5, inplace=True)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y, self.w)
        before = torch.cos(x) @ self.w
        self.drop(x)
        return side, before, torch.sin(x) @ self.w


# --- in-place modules, functions and results -----------------------------------------------


class _ModuleWrite(_Hazard):
    act: nn.Module

    def write(self, x: Tensor, y: Tensor) -> None:
        self.act(x)


class InplaceReLU(_ModuleWrite):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)


class InplaceHardtanh(_ModuleWrite):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Hardtanh(-0.5, 0.5, inplace=True)


class InplaceSiLUModule(_ModuleWrite):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.SiLU(inplace=True)


class InplaceReLUChained(_ModuleWrite):
    """The result of ``nn.ReLU(inplace=True)`` is its input: ``self.act(x).mul_(2)``."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def write(self, x: Tensor, y: Tensor) -> None:
        self.act(x).mul_(2.0)


class InplaceModuleByKeyword(_ModuleWrite):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.LeakyReLU(0.1, inplace=True)

    def write(self, x: Tensor, y: Tensor) -> None:
        self.act(input=x)


class OutAliasesAnInput(nn.Module):
    """``torch.add(a, b, out=c)`` into a preallocated input ``c``, read before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(a, self.w)
        before = c @ self.w
        torch.add(a, b, out=c)
        return side, before, c.sin() @ self.w


def _abc() -> tuple[Tensor, Tensor, Tensor]:
    return _randn(D, D, seed=7), _randn(D, D, seed=8), _randn(D, D, seed=9)


class SetSource(nn.Module):
    """``z = y.set_(x); z.mul_(3)``: after ``set_``, ``y`` (and ``z``) *is* ``x``'s storage."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        side = tower(y.cos(), self.w)
        before = torch.cos(x) @ self.w
        z = y.set_(x)
        z.mul_(3.0)
        return side, before, torch.sin(x) @ self.w


_FX_IADD = "symbolic_trace records `v += y` as an out-of-place add (fx Proxy has no __iadd__)"
_FX_UNBOUND = "symbolic_trace cannot pass a Proxy to an unbound torch.Tensor method"
_FX_SETITEM = "symbolic_trace cannot trace item assignment (fx Proxy has no __setitem__)"


def _setitem(x: Tensor, y: Tensor) -> None:
    x[torch.tensor([0, 5])] = y[:2]


def _iadd_view(x: Tensor, y: Tensor) -> None:
    v = x[:, 1]
    v += y[0]


def _x16(x: Tensor) -> Tensor:
    return torch.ops.aten._unsafe_view.default(x, [D * D])


# (name, write) of the simple cases: each updates ``x`` through some construct.
_WRITES: tuple[tuple[str, Callable[[Tensor, Tensor], object]], ...] = (
    ("F.relu_", lambda x, y: F.relu_(x)),
    ("F.relu(inplace=True)", lambda x, y: F.relu(x, inplace=True)),
    ("F.silu(inplace=True)", lambda x, y: F.silu(x, inplace=True)),
    ("F.leaky_relu(x,0.1,True)", lambda x, y: F.leaky_relu(x, 0.1, True)),
    ("F.hardtanh(inplace=True)", lambda x, y: F.hardtanh(x, -0.5, 0.5, inplace=True)),
    ("F.hardtanh_", lambda x, y: F.hardtanh_(x, -0.5, 0.5)),
    ("F.leaky_relu_", lambda x, y: F.leaky_relu_(x, 0.1)),
    ("F.elu_", lambda x, y: F.elu_(x)),
    ("F.threshold_", lambda x, y: F.threshold_(x, 0.1, 0.0)),
    ("torch.clamp_", lambda x, y: torch.clamp_(x, min=-0.5, max=0.5)),
    ("x.masked_fill_", lambda x, y: x.masked_fill_(y > 0, 0.0)),
    ("torch.cumsum(y,0,out=x)", lambda x, y: torch.cumsum(y, 0, out=x)),
    ("torch.diagonal.fill_", lambda x, y: torch.diagonal(x).fill_(0.0)),
    ("torch.mul(x,3,out=x)", lambda x, y: torch.mul(x, 3, out=x)),
    ("x.add_(1).mul_(2)", lambda x, y: x.add_(1).mul_(2)),
    ("F.relu(inplace=True).mul_", lambda x, y: F.relu(x, inplace=True).mul_(2)),
    ("x.t_().mul_", lambda x, y: x.t_().mul_(2)),
    ("x.mul_(2).t().add_(y)", lambda x, y: x.mul_(2).t().add_(y)),
    ("x.T.mul_", lambda x, y: x.T.mul_(2)),
    ("x.mT.mul_", lambda x, y: x.mT.mul_(2)),
    ("x.H.mul_", lambda x, y: x.H.mul_(2)),
    ("x.mH.mul_", lambda x, y: x.mH.mul_(2)),
    ("x.data.mul_", lambda x, y: x.data.mul_(2)),
    ("x.real.mul_", lambda x, y: x.real.mul_(2)),
    ("x.view.mul_", lambda x, y: x.view(D * D).mul_(2)),
    ("x.reshape.mul_", lambda x, y: x.reshape(2, -1).mul_(2)),
    ("x.flatten.mul_", lambda x, y: x.flatten().mul_(2)),
    ("x.unsqueeze.mul_", lambda x, y: x.unsqueeze(0).mul_(2)),
    ("x.broadcast_to.mul_", lambda x, y: x.broadcast_to(D, D).mul_(2)),
    ("torch.moveaxis.mul_", lambda x, y: torch.moveaxis(x, 0, 1).mul_(2)),
    ("x.ravel.mul_", lambda x, y: x.ravel().mul_(2)),
    ("x.hsplit[1].mul_", lambda x, y: x.hsplit(2)[1].mul_(2)),
    ("x.chunk[0].copy_", lambda x, y: x.chunk(2)[0].copy_(y[:4])),
    ("x.float.mul_(fp32)", lambda x, y: x.float().mul_(2)),
    ("x.to(fp32).mul_", lambda x, y: x.to(torch.float32).mul_(2)),
    ("x.type_as(y).mul_", lambda x, y: x.type_as(y).mul_(2)),
    ("x.cpu.mul_", lambda x, y: x.cpu().mul_(2)),
    ("x.contiguous.mul_", lambda x, y: x.contiguous().mul_(2)),
    ("aten._unsafe_view.add_", lambda x, y: _x16(x).add_(1)),
    ("x.__setitem__", lambda x, y: x.__setitem__(1, y[0])),
    ("custom_op_mutates_unknown", lambda x, y: torch.ops.msched_soundness.opaque_copy(x, y)),
    ("fx_wrap_returns_a_view", lambda x, y: first_row(x).mul_(2)),
    ("x.__iadd__", lambda x, y: x.__iadd__(y)),
    ("x.__setitem__(tensor)", lambda x, y: x.__setitem__(torch.tensor([0, 5]), y[:2])),
    # view functions given their tensor by keyword
    (
        "torch.narrow(input=x).copy_",
        lambda x, y: torch.narrow(input=x, dim=1, start=2, length=3).copy_(y[:, :3]),
    ),
    ("torch.select(input=x).mul_", lambda x, y: torch.select(input=x, dim=0, index=1).mul_(2)),
    (
        "torch.transpose(input=x).add_",
        lambda x, y: torch.transpose(input=x, dim0=0, dim1=1).add_(y),
    ),
    (
        "torch.unsqueeze(input=x).mul_",
        lambda x, y: torch.unsqueeze(input=x, dim=0).mul_(y[:1, :, None]),
    ),
)

CASES: tuple[Case, ...] = (
    Case("kv_cache_index_copy_sdpa", KVCacheAttention, _kv_inputs),
    Case("kv_cache_setitem_sdpa", KVCacheSetitem, _kv_inputs, no_fx=_FX_SETITEM),
    Case("tied_embedding_max_norm", TiedEmbeddingMaxNorm, _ids_h),
    Case("tied_functional_embedding", TiedFunctionalEmbedding, _ids_h),
    Case("buffer_add_", BufferUpdatedInPlace, _xy),
    Case("buffer_two_names", TiedBufferAndParameter, _xy),
    Case("fx_wrap_function", WrappedFunction, _xy),
    Case("custom_op_mutates_args", Eagle3Capture, _capture_inputs),
    Case("custom_op_register_mutation", RegisteredMutation, _xy),
    Case("user_module_buffer", UserModuleUpdatesItsBuffer, _xy, leaves=(RunningStat,)),
    Case("user_module_input", UserModuleMutatesItsInput, _xy, leaves=(ClampInPlace,)),
    Case("batchnorm_train", BatchNormTrain, _xy),
    Case("F.batch_norm_train", FunctionalBatchNorm, _xy),
    Case("rng_dropout_rand_like", DropoutAndNoise, _xy, random=True),
    Case("rng_dropout_modules", DropoutModules, _xy, random=True),
    Case("rng_sampling", Sampling, _xy, random=True),
    Case("nn.Dropout(inplace=True)", InplaceDropoutModule, _xy, random=True),
    Case("rng_sdpa_dropout_rand_like", AttentionDropout, _xy, random=True),
    _hazard("rng_x.uniform_", lambda x, y: x.uniform_(), random=True),
    Case("custom_op_mutates_a_list", CustomOpWritesAList, _xy),
    Case("tied_linears", TiedLinears, _xy),
    Case("cache_view_attributes", CacheViewAttributes, _xy),
    Case("buffer_view_of_buffer", BufferViewOfBuffer, _xy),
    Case("submodule_buffer_tied", SubmoduleBufferTied, _xy, leaves=(RunningStat,)),
    Case("nn.ReLU(inplace=True)(x).mul_", InplaceReLUChained, _xy),
    Case("nn.LeakyReLU(inplace=True)(input=x)", InplaceModuleByKeyword, _xy),
    Case("lora_merge_into_linear", LoRAMerge, _xy),
    Case("eval_batchnorm_stats_updated", EvalBatchNormStatsUpdated, _xy),
    Case("foreach_ema_buffers", ForeachEMA, _xy),
    Case("torch.batch_norm_positional_train", BatchNormByAten, _xy),
    Case("torch.instance_norm_running_stats", InstanceNormTrackedStats, _xy),
    Case("forward_hook_captures_hidden", HiddenStateCaptureHook, _xy),
    Case("forward_pre_hook_observer", CalibrationPreHook, _xy),
    Case("spectral_norm_train_twice", SpectralNormDiscriminator, _xy),
    Case("leaf_plain_attr_kv_cache", EngineBoundKVCache, _xy_slots, leaves=(PagedAttentionLayer,)),
    Case("kv_cache_narrow_by_keyword", NarrowKeywordKVCache, _abc),
    Case("nn.ReLU(inplace=True)", InplaceReLU, _xy),
    Case("nn.Hardtanh(inplace=True)", InplaceHardtanh, _xy),
    Case("nn.SiLU(inplace=True)", InplaceSiLUModule, _xy),
    Case("torch.add(out=c)", OutAliasesAnInput, _abc),
    Case("y.set_(x)", SetSource, _xy),
    _hazard("x[idx]=y", _setitem, no_fx=_FX_SETITEM),
    _hazard("torch.Tensor.add_(x,y)", lambda x, y: torch.Tensor.add_(x, y), no_fx=_FX_UNBOUND),
    _hazard("v=x[:,1];v+=y[0]", _iadd_view, no_fx=_FX_IADD),
    _hazard("x[:,1].__iadd__", lambda x, y: x[:, 1].__iadd__(y[0])),
    _hazard("F.dropout(inplace=True)", lambda x, y: F.dropout(x, 0.5, True, True), random=True),
    *(_hazard(name, write) for name, write in _WRITES),
)
