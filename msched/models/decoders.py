"""Reference decoders with Eagle3-style hidden-state captures, runnable on CPU.

`decoder_stack` builds a synthetic FX decoder stack directly from aten ops and three custom
ops defined here (all real ``torch.library`` custom ops with fake implementations):

- ``msched::inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()`` —
  the Eagle3 capture: writes ``src`` into ``dest[..., start:end]`` and returns nothing (an
  engine's own op of the same schema can take its place: ``decoder_stack(capture_op=...)``);
- ``msched::attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out) -> ()`` — causal
  single-head attention written into a preallocated buffer;
- ``msched::moe_experts(Tensor x, Tensor router, Tensor w1, Tensor w2) -> Tensor`` — top-1
  routed experts (the shared expert is ordinary matmuls, so it can run in parallel).

Layer ``i`` of the stack (0-based; the last layer can be captured) is:
RMSNorm → q/k/v projections → attention into a buffer → o projection → residual add →
RMSNorm → MLP (or MoE: routed experts ∥ shared expert) → residual add → optional capture
of the hidden state into slice ``j`` of the capture buffer ``dest`` (a graph input).

Sharded stacks (``tp=``, ``ep=``, ``microbatches=``) add ``torch.distributed``'s functional
collectives as Dynamo traces them: `msched.models.parallel`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from msched._lazy import lazy_graph_module
from msched._torch_internals import (
    FunctionSchema,
    OpOverload,
    OpOverloadPacket,
    fake_tensor_mode,
    schema_of,
)
from msched.errors import InvalidArgumentError
from msched.limits import positive_int
from msched.models import reference_ops as _reference_ops  # noqa: F401  (defines the ops)
from msched.models.parallel import Sharding, all_reduce, expert_parallel_moe, shard, sharding

aten = torch.ops.aten

#: The schema a capture op must have (`capture_overload`), up to the names of its arguments;
#: ``int`` may also be ``SymInt``, and arguments with defaults may follow.
CAPTURE_SCHEMA = "(Tensor(a!) dest, Tensor src, int start, int end) -> ()"
_CAPTURE_KINDS = (("Tensor",), ("Tensor",), ("int", "SymInt"), ("int", "SymInt"))


def capture_overload(op: object = None) -> OpOverload:
    """The capture op ``op`` names, checked: an op with the schema `CAPTURE_SCHEMA`, whatever
    its argument names, that writes its second argument into ``first[..., start:end]``
    (msched's ``inplace_slice_copy`` for None).

    ``op`` is an ``OpOverload`` (``torch.ops.ns.name.default``), an ``OpOverloadPacket``
    (its ``default`` overload) or a ``torch.library.custom_op``.  Anything else, or an op
    whose arguments differ in kind or order, raises `msched.InvalidArgumentError` saying what
    is expected.
    """
    if op is None:
        return torch.ops.msched.inplace_slice_copy.default
    overload = op
    if isinstance(overload, OpOverloadPacket):
        overload = getattr(overload, "default", overload)
    overload = getattr(overload, "_opoverload", overload)  # a torch.library.custom_op
    if not isinstance(overload, OpOverload):
        raise InvalidArgumentError(
            f"capture_op must be a torch op with the schema {CAPTURE_SCHEMA} "
            f"(e.g. torch.ops.myengine.inplace_slice_copy.default), got {op!r}"
        )
    problem = _capture_schema_problem(schema_of(overload))
    if problem is not None:
        raise InvalidArgumentError(
            f"capture_op {overload} has the schema {schema_of(overload)}: {problem}; a capture "
            f"op has the schema {CAPTURE_SCHEMA} (any argument names; arguments with defaults "
            "may follow) and writes src into dest[..., start:end]"
        )
    return overload


def _capture_schema_problem(schema: FunctionSchema) -> str | None:
    """What is wrong with ``schema`` for a capture op, or None."""
    arguments = list(schema.arguments)
    head, rest = arguments[: len(_CAPTURE_KINDS)], arguments[len(_CAPTURE_KINDS) :]
    kinds = [str(a.type) for a in head]
    if len(head) < len(_CAPTURE_KINDS) or any(
        kind not in allowed for kind, allowed in zip(kinds, _CAPTURE_KINDS, strict=True)
    ):
        got = ", ".join(f"{a.type} {a.name}" for a in head)
        return f"its arguments are not (Tensor, Tensor, int, int) in this order: ({got})"
    if any(a.kwarg_only for a in head):
        return "its first four arguments must be positional"
    extra = [a.name for a in rest if not a.has_default_value()]
    if extra:
        return f"its arguments after the fourth need defaults ({', '.join(extra)} has none)"
    written = [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    if written != [head[0].name]:
        return (
            f"it must write {head[0].name} (its first argument) and nothing else "
            f"(Tensor(a!) {head[0].name}), but writes {written or 'nothing'}"
        )
    if schema.returns:
        return "it must return nothing (-> ())"
    return None


def capture_argument_names(op: OpOverload) -> tuple[str, ...]:
    """The names ``op`` gives its destination, source, start and end (its schema's)."""
    return tuple(a.name for a in op._schema.arguments[: len(_CAPTURE_KINDS)])


@dataclass
class DecoderStack:
    """A synthetic decoder stack: the graph, its capture nodes, inputs and the reference run.

    ``gm`` is built once per stack (schedule it in place if you like); ``reference()`` runs an
    unscheduled twin of it, so it is unaffected by scheduling ``gm``.
    ``layer_of`` maps the name of every node built for a decoder layer (its weights, its ops
    and its capture) to the layer's 0-based index; the inputs, the final norm and ``output``
    belong to no layer.  Names survive `msched.schedule`, so it reads a scheduled graph too.

    Nothing is done before it is needed: ``gm`` generates its Python code when it is first
    called or its ``code`` is read (a ``torch.fx`` lazy graph module; `msched.schedule` and
    `msched.verify` read the graph, not the code), and the reference twin is built, from the
    same arguments (so the same weights), on the first ``reference()``.
    """

    gm: GraphModule
    dest: Node
    captures: list[Node]
    n_layers: int
    capture_layers: tuple[int, ...]
    hidden: int
    tokens: int
    seed: int
    layer_of: Mapping[str, int]
    _build_reference: Callable[[], GraphModule] = field(repr=False, compare=False)
    _reference_gm: GraphModule | None = field(default=None, init=False, repr=False, compare=False)
    sharding: Sharding = field(default_factory=Sharding)
    microbatches: int = 1
    _build_unsharded: Callable[[], GraphModule] | None = field(
        default=None, repr=False, compare=False
    )

    def example_inputs(self) -> tuple[Tensor, Tensor]:
        """Fresh CPU inputs in placeholder order: hidden states ``x`` and a zeroed ``dest``,
        ``microbatches * tokens`` rows each.  The same on every rank, except with ``ep > 1``,
        where each rank has tokens of its own (drawn from ``seed + 1 + rank``)."""
        offset = self.sharding.rank if self.sharding.ep > 1 else 0
        g = torch.Generator().manual_seed(self.seed + 1 + offset)
        rows = self.tokens * self.microbatches
        x = torch.randn(rows, self.hidden, generator=g)
        dest = torch.zeros(rows, self.hidden * len(self.capture_layers))
        return x, dest

    def unsharded_reference(self) -> tuple[Tensor, Tensor]:
        """Output and capture buffer of the unsharded stack (``tp=1, ep=1`` and the same
        seed, so the same full weights) on `example_inputs`, one micro-batch at a time: what
        the sharded graph must compute on this rank.  Needs no process group."""
        if self._build_unsharded is None:
            return self.reference()
        plain = self._build_unsharded()
        x, dest = self.example_inputs()
        outs = []
        for m in range(self.microbatches):
            rows = slice(m * self.tokens, (m + 1) * self.tokens)
            outs.append(plain(x[rows], dest[rows]))
        return torch.cat(outs), dest

    def reference(self) -> tuple[Tensor, Tensor]:
        """Output and capture buffer of the unscheduled graph on `example_inputs`."""
        if self._reference_gm is None:
            self._reference_gm = self._build_reference()
        x, dest = self.example_inputs()
        out = self._reference_gm(x, dest)
        return out, dest

    def with_sizes(self) -> DecoderStack:
        """Give every node of ``gm`` its size: ``meta["val"]``, a fake tensor propagated from
        `example_inputs` (the weights are the module's real buffers); returns ``self``.

        Why: `msched.peak_memory`, ``Schedule.memory`` and every picture's memory read the
        nodes' sizes, and the stack is built without them (propagating costs a tenth of a
        second on a 12-layer stack, which most tests need not pay).  The CLI and the plugin's
        ``decoder_stack`` fixture call it.
        """
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        mode = fake_tensor_mode(allow_non_fake_inputs=True)
        FakeTensorProp(self.gm, mode=mode).propagate(*self.example_inputs())
        return self

    def capture_slice(self, layer: int) -> tuple[int, int]:
        """The ``[start, end)`` columns of ``dest`` that capture ``layer`` writes."""
        j = self.capture_layers.index(layer)
        return j * self.hidden, (j + 1) * self.hidden


class _Builder:
    """Appends the nodes of one decoder stack to an FX graph (one method per block)."""

    def __init__(
        self,
        hidden: int,
        seed: int,
        capture_kwargs: bool,
        capture_op: OpOverload,
        shards: Sharding,
    ) -> None:
        self.graph = Graph()
        self.root = nn.Module()
        self.hidden = hidden
        self.gen = torch.Generator().manual_seed(seed)
        self.capture_kwargs = capture_kwargs
        self.capture_op = capture_op
        self.shards = shards
        self.drawn: dict[str, Node] = {}  # micro-batches share the weights

    def weight(self, name: str, *shape: int, dim: int = 0, parts: int = 1) -> Node:
        """The weight ``name``, drawn in full from the seed; this rank's block ``parts`` of
        it along ``dim`` when ``parts > 1``."""
        if name in self.drawn:
            return self.drawn[name]
        scale = 1.0 / math.sqrt(shape[-2] if len(shape) > 1 else 1.0)
        if len(shape) == 1:
            value = 1.0 + 0.1 * torch.randn(*shape, generator=self.gen)
        else:
            value = torch.randn(*shape, generator=self.gen) * scale
        if parts > 1:
            value = shard(value, dim, parts, self.shards.rank)
        self.root.register_buffer(name, value)
        self.drawn[name] = self.graph.get_attr(name)
        return self.drawn[name]

    def op(self, target: object, *args: object, **kwargs: object) -> Node:
        return self.graph.call_function(target, args, kwargs)  # type: ignore[arg-type]

    def rms_norm(self, h: Node, name: str) -> Node:
        w = self.weight(name, self.hidden)
        ms = self.op(aten.mean.dim, self.op(aten.mul.Tensor, h, h), [-1], True)
        r = self.op(aten.rsqrt.default, self.op(aten.add.Scalar, ms, 1e-6))
        return self.op(aten.mul.Tensor, self.op(aten.mul.Tensor, h, r), w)

    def linear(self, x: Node, name: str, d_in: int, d_out: int, dim: int = 0) -> Node:
        """``x @ W``; with ``tp > 1`` W's block of columns (``dim=1``) or rows (``dim=0``,
        the partial sum row-parallel linears all-reduce)."""
        tp = self.shards.tp
        return self.op(aten.mm.default, x, self.weight(name, d_in, d_out, dim=dim, parts=tp))

    def reduced(self, partial: Node) -> Node:
        """A row-parallel product summed over the ranks (itself when not sharded)."""
        return partial if self.shards.tp == 1 else all_reduce(self, partial)

    def attention_block(self, h: Node, i: int) -> Node:
        hn = self.rms_norm(h, f"l{i}_ln1")
        q, k = (
            self.op(aten.mm.default, hn, self.weight(f"l{i}_w{p}", *[self.hidden] * 2))
            for p in "qk"
        )
        v = self.linear(hn, f"l{i}_wv", self.hidden, self.hidden, 1)  # whole q, k: one head
        buf = self.op(aten.empty_like.default, q if self.shards.tp == 1 else v)
        self.op(torch.ops.msched.attention.default, q, k, v, buf)
        projected = self.reduced(self.linear(buf, f"l{i}_wo", self.hidden, self.hidden))
        return self.op(aten.add.Tensor, h, projected)

    def mlp(self, x: Node, prefix: str) -> Node:
        ffn = 2 * self.hidden
        gate = self.linear(x, f"{prefix}_wg", self.hidden, ffn, 1)
        up = self.linear(x, f"{prefix}_wu", self.hidden, ffn, 1)
        act = self.op(aten.mul.Tensor, self.op(aten.silu.default, gate), up)
        return self.reduced(self.linear(act, f"{prefix}_wd", ffn, self.hidden))

    def ffn_block(self, h: Node, i: int, moe: bool) -> Node:
        hn = self.rms_norm(h, f"l{i}_ln2")
        if not moe:
            return self.op(aten.add.Tensor, h, self.mlp(hn, f"l{i}"))
        if self.shards.ep > 1:
            routed = expert_parallel_moe(self, hn, i)
            shared = self.mlp(hn, f"l{i}_shared")
            return self.op(aten.add.Tensor, self.op(aten.add.Tensor, h, routed), shared)
        experts, ffn = 4, 2 * self.hidden
        routed = self.op(
            torch.ops.msched.moe_experts.default,
            hn,
            self.weight(f"l{i}_router", self.hidden, experts),
            self.weight(f"l{i}_w1", experts, self.hidden, ffn),
            self.weight(f"l{i}_w2", experts, ffn, self.hidden),
        )
        shared = self.mlp(hn, f"l{i}_shared")
        return self.op(aten.add.Tensor, self.op(aten.add.Tensor, h, routed), shared)

    def layers(
        self,
        hs: list[Node],
        dests: list[Node],
        n_layers: int,
        capture_layers: tuple[int, ...],
        moe: bool,
    ) -> tuple[list[Node], list[Node], dict[str, int]]:
        """Append ``n_layers`` layers after the hidden state ``hs[m]`` of each micro-batch
        ``m`` (layer by layer, micro-batch after micro-batch; each captures into
        ``dests[m]``): the last hidden states, the captures, and the layer of every node
        appended (by name)."""
        captures: list[Node] = []
        bounds = []  # [first, end) positions of each layer's nodes in the graph
        for i in range(n_layers):
            first = len(self.graph.nodes)
            for m, h in enumerate(hs):
                hs[m] = self.ffn_block(self.attention_block(h, i), i, moe)
                if i in capture_layers:
                    name = f"capture_{i}" if len(hs) == 1 else f"mb{m}_capture_{i}"
                    captures.append(self.capture(dests[m], hs[m], capture_layers.index(i), name))
            bounds.append((first, len(self.graph.nodes)))
        nodes = list(self.graph.nodes)
        layer_of = {n.name: i for i, (lo, hi) in enumerate(bounds) for n in nodes[lo:hi]}
        return hs, captures, layer_of

    def capture(self, dest: Node, h: Node, j: int, name: str) -> Node:
        start, end = j * self.hidden, (j + 1) * self.hidden
        op = self.capture_op
        if self.capture_kwargs:  # by the op's own names
            kwargs: dict[str, Any] = dict(
                zip(capture_argument_names(op), (dest, h, start, end), strict=True)
            )
            return self.graph.create_node("call_function", op, (), kwargs, name=name)
        return self.graph.create_node("call_function", op, (dest, h, start, end), name=name)


def _check_stack_args(
    n_layers: int, capture_layers: Sequence[int], hidden: int, tokens: int
) -> None:
    positive_int(n_layers, "n_layers")
    positive_int(hidden, "hidden")
    positive_int(tokens, "tokens")
    outside, repeated = capture_layer_problems(n_layers, capture_layers)
    if outside:
        raise InvalidArgumentError(
            f"capture layers {outside} are outside the stack: layers are 0..{n_layers - 1}"
        )
    if repeated:
        raise InvalidArgumentError(f"capture layers {list(capture_layers)} repeat a layer")


def capture_layer_problems(n_layers: int, capture_layers: Sequence[int]) -> tuple[list[Any], bool]:
    """The one check of capture layers against a stack of ``n_layers``: the layers that are
    not in it (not ints, or outside ``0..n_layers-1``) and whether a layer repeats.  Callers
    word the error (`decoder_stack`, the CLI)."""
    outside = [c for c in capture_layers if not isinstance(c, int) or not 0 <= c < n_layers]
    return outside, len(set(capture_layers)) != len(capture_layers)


def decoder_stack(
    n_layers: int = 6,
    capture_layers: Sequence[int] = (1, 3, 5),
    moe: bool = False,
    hidden: int = 8,
    tokens: int = 4,
    seed: int = 0,
    capture_kwargs: bool = True,
    capture_op: object = None,
    tp: int = 1,
    ep: int = 1,
    microbatches: int = 1,
    rank: int | None = None,
    group_name: str | None = None,
) -> DecoderStack:
    """Build a synthetic decoder stack as an FX graph (see the module docstring).

    Placeholders are ``x`` (``[tokens, hidden]``) and ``dest`` (``[tokens, hidden *
    len(capture_layers)]``); weights are ``get_attr`` buffers drawn from ``seed``.  With
    ``capture_kwargs=False`` captures pass their arguments positionally.

    ``capture_op`` is the op of the captures (default ``msched::inplace_slice_copy``): any op
    with the schema `CAPTURE_SCHEMA`, ``(Tensor(a!) dest, Tensor src, int start, int end) ->
    ()`` up to the argument names (keyword captures use the op's own names), that writes
    ``src`` into ``dest[..., start:end]``, such as an engine's own
    ``torch.ops.<ns>.inplace_slice_copy.default`` (`capture_overload` says what it accepts;
    arguments of other kinds or in another order are an `msched.InvalidArgumentError`).
    ``.captures`` are its nodes and ``.reference()`` runs it.

    Sharded stacks (`msched.models.parallel` says how the weights are cut); the defaults
    build the unsharded graph above, unchanged:

    - ``tp``: tensor parallel over ``tp`` ranks, an all-reduce (``_c10d_functional.all_reduce``
      then ``wait_tensor``) after each layer's ``o`` projection and MLP down projection;
    - ``ep`` (with ``moe=True``): expert parallel, the routed experts behind an
      ``all_to_all_single`` dispatch and combine, the shared expert beside them;
    - ``microbatches``: that many independent micro-batches of ``tokens`` rows each, cut from
      ``x`` (and ``dest``) by rows and run layer by layer, each with its own collectives;
      the output is theirs concatenated;
    - ``rank`` (default: this process's rank in the default group, else 0) picks the
      shard, ``group_name`` (default: the default group's name, ``"0"``) is the group the
      collectives name.  Building needs no process group; running a sharded stack needs
      one of ``tp`` (or ``ep``) ranks, all running the graph.

    ``.unsharded_reference()`` is what the graph must compute on this rank, without a group.
    """
    capture_layers = tuple(capture_layers)
    _check_stack_args(n_layers, capture_layers, hidden, tokens)
    positive_int(microbatches, "microbatches")
    shards = sharding(tp, ep, moe, hidden, tokens, rank, group_name)
    op = capture_overload(capture_op)
    args = (n_layers, capture_layers, moe, hidden, seed, capture_kwargs, op)
    build = functools.partial(_build, *args, shards, microbatches)
    gm, dest, captures, layer_of = build("DecoderStack")
    plain = functools.partial(_build, *args, Sharding(tokens=tokens), 1, "DecoderStackUnsharded")
    unsharded = shards.degree > 1 or microbatches > 1
    return DecoderStack(
        gm=gm,
        dest=dest,
        captures=captures,
        n_layers=n_layers,
        capture_layers=capture_layers,
        hidden=hidden,
        tokens=tokens,
        seed=seed,
        layer_of=layer_of,
        _build_reference=lambda: build("DecoderStackReference")[0],
        sharding=shards,
        microbatches=microbatches,
        _build_unsharded=(lambda: plain()[0]) if unsharded else None,
    )


def _build(
    n_layers: int,
    capture_layers: tuple[int, ...],
    moe: bool,
    hidden: int,
    seed: int,
    capture_kwargs: bool,
    capture_op: OpOverload,
    shards: Sharding,
    microbatches: int,
    class_name: str,
) -> tuple[GraphModule, Node, list[Node], dict[str, int]]:
    """The module of one stack (its code not generated yet), ``dest``, captures, layers.

    Deterministic: the same arguments give the same graph, names and weights."""
    b = _Builder(hidden, seed, capture_kwargs, capture_op, shards)
    x = b.graph.placeholder("x")
    dest = b.graph.placeholder("dest")
    hs, dests = _micro_batches(b, x, dest, microbatches)
    hs, captures, layer_of = b.layers(hs, dests, n_layers, capture_layers, moe)
    outs = [b.rms_norm(h, "final_ln") for h in hs]
    b.graph.output(outs[0] if len(outs) == 1 else b.op(aten.cat.default, outs, 0))
    return lazy_graph_module(b.root, b.graph, class_name), dest, captures, layer_of


def _micro_batches(
    b: _Builder, x: Node, dest: Node, microbatches: int
) -> tuple[list[Node], list[Node]]:
    """The rows of ``x`` and ``dest`` of each micro-batch (themselves for one)."""
    if microbatches == 1:
        return [x], [dest]
    rows = [(m * b.shards.tokens, (m + 1) * b.shards.tokens) for m in range(microbatches)]
    hs = [b.op(aten.slice.Tensor, x, 0, lo, hi) for lo, hi in rows]
    return hs, [b.op(aten.slice.Tensor, dest, 0, lo, hi) for lo, hi in rows]


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x * x) + eps) * weight`` over the last dimension."""

    def __init__(self, hidden: int, gen: torch.Generator, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=gen))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def _matrix(gen: torch.Generator, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, generator=gen) / math.sqrt(shape[-2]))


class Attention(nn.Module):
    """q/k/v projections, ``msched::attention`` into a fresh buffer, o projection."""

    def __init__(self, hidden: int, gen: torch.Generator) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (_matrix(gen, hidden, hidden) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        out = torch.empty_like(q)
        torch.ops.msched.attention(q, k, v, out)
        return out @ self.wo


class MLP(nn.Module):
    """SiLU-gated MLP with a ``2 * hidden`` inner width."""

    def __init__(self, hidden: int, gen: torch.Generator) -> None:
        super().__init__()
        self.wg = _matrix(gen, hidden, 2 * hidden)
        self.wu = _matrix(gen, hidden, 2 * hidden)
        self.wd = _matrix(gen, 2 * hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return (torch.nn.functional.silu(x @ self.wg) * (x @ self.wu)) @ self.wd


class MoE(nn.Module):
    """Top-1 routed experts (``msched::moe_experts``) plus a shared expert, independent."""

    def __init__(self, hidden: int, gen: torch.Generator, experts: int = 4) -> None:
        super().__init__()
        self.router = _matrix(gen, hidden, experts)
        self.w1 = _matrix(gen, experts, hidden, 2 * hidden)
        self.w2 = _matrix(gen, experts, 2 * hidden, hidden)
        self.shared = MLP(hidden, gen)

    def forward(self, x: Tensor) -> Tensor:
        routed = torch.ops.msched.moe_experts(x, self.router, self.w1, self.w2)
        return routed + self.shared(x)


class DecoderLayer(nn.Module):
    """Pre-norm residual layer: attention, then MLP or MoE."""

    def __init__(self, hidden: int, gen: torch.Generator, moe: bool) -> None:
        super().__init__()
        self.ln1, self.attn = RMSNorm(hidden, gen), Attention(hidden, gen)
        self.ln2 = RMSNorm(hidden, gen)
        self.ffn: nn.Module = MoE(hidden, gen) if moe else MLP(hidden, gen)

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.ffn(self.ln2(h))


class TinyDecoder(nn.Module):
    """A small decoder with Eagle3-style hidden-state captures, for inference on CPU.

    ``forward(x, capture)`` takes hidden states ``x`` of shape ``[tokens, hidden]`` and a
    preallocated buffer ``capture`` of shape ``[tokens, hidden * len(capture_layers)]``; after
    layer ``capture_layers[j]`` it copies the hidden state into columns ``capture_slice`` of
    ``capture`` through ``msched::inplace_slice_copy`` (which returns nothing, so nothing
    downstream depends on it).  Returns the final RMSNorm of the last hidden state.  The last
    layer can be captured.  Parameters are frozen (``requires_grad=False``): it is an
    inference model, and ``msched.backend`` compiles inference graphs.
    """

    def __init__(
        self,
        n_layers: int,
        hidden: int,
        capture_layers: Sequence[int],
        moe: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.capture_layers = tuple(capture_layers)
        _check_stack_args(n_layers, self.capture_layers, hidden, 1)
        gen = torch.Generator().manual_seed(seed)
        self.hidden = hidden
        self.layers = nn.ModuleList(DecoderLayer(hidden, gen, moe) for _ in range(n_layers))
        self.norm = RMSNorm(hidden, gen)
        self.requires_grad_(False)

    def capture_slice(self, layer: int) -> tuple[int, int]:
        """The ``[start, end)`` columns of the capture buffer that ``layer`` writes."""
        j = self.capture_layers.index(layer)
        return j * self.hidden, (j + 1) * self.hidden

    def example_inputs(self, tokens: int, seed: int = 1) -> tuple[Tensor, Tensor]:
        """Fresh inputs: hidden states drawn from ``seed`` and a zeroed capture buffer."""
        x = torch.randn(tokens, self.hidden, generator=torch.Generator().manual_seed(seed))
        return x, torch.zeros(tokens, self.hidden * len(self.capture_layers))

    def forward(self, x: Tensor, capture: Tensor) -> Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i in self.capture_layers:
                start, end = self.capture_slice(i)
                torch.ops.msched.inplace_slice_copy(capture, h, start, end)
        return self.norm(h)
