"""How much communication `msched.schedule` hides, on sharded graphs, per stream count, next
to PyTorch's own overlap pass.

Graphs: the sharded decoder stacks of `msched.models.decoders.decoder_stack` on rank 0 of 2
(PyTorch's functional collectives on the default group; building them needs no process
group), every layer captured: ``tp``, tensor parallel (an all-reduce after the attention
output projection and after the MLP's down projection); ``tp-2mb``, the same with two
micro-batches (two-batch overlap: one micro-batch's all-reduce under the other's compute);
``ep-moe``, an expert-parallel MoE (all-to-all dispatch and combine, a shared expert);
and ``llama-tp`` (`sharded_llama`), a tiny random ``transformers`` Llama of 2 layers sharded
tensor parallel by hand on rank 0 of a fake 2-rank process group, the aten-level graph that
``torch.compile`` with ``aot_autograd`` gives of its forward under ``torch.no_grad()``
(functional ``all_reduce.default`` and ``wait_tensor.default``; ``--layers`` does not apply;
skipped, with a note under the table, without ``transformers``).
Costs are `msched.DefaultCostModel`'s (a collective's communication ``--comm``, 30 by
default; a matmul 10).

For each graph and stream count it prints the makespan msched claims (and `msched.simulate`
of the emitted module confirms: a mismatch is an error), the serial makespan (the
unscheduled graph simulated: every collective waited right after its issue), their ratio,
the lower bound (`msched.analysis.bounds`, with communication as a latency and one channel
per group) and the makespan over it, and the optimum (`msched.optimal_makespan`, whose CP-SAT
model has the same communication; ``*`` marks one the solver did not prove within
``--time-limit`` seconds, "-" a run without OR-Tools) and the makespan over it.

Then PyTorch's pass: ``pytorch`` is the makespan (`msched.simulate`, one stream, the same
costs) of the order that ``torch._inductor.fx_passes.overlap_scheduling.
schedule_overlap_bucketing`` gives a copy of the graph when it is told msched's cost of every
node (``custom_runtime_estimation``), and ``msched/pytorch`` is msched's makespan over it:
the target is at most 1 on the one-stream rows (PyTorch's order runs on one stream, so on
the other rows the ratio is msched's streams against it).  ``alloc-KiB`` and ``pytorch-KiB``
are `msched.peak_memory`'s ``allocated`` peak of msched's schedule and of PyTorch's order on
the stack's example inputs (KiB: the stacks' tensors are a few hundred bytes), ``bound-MiB``
and ``pytorch-bound-MiB`` its ``reserved_bound`` (the allocator's segments under any timing:
a 2 MiB small-block segment per stream used, here).

What the pass needs that msched's graphs lack, and what it probes (`pytorch_order`):

- it finds collectives and waits by their ``_c10d_functional.*.default`` overloads; the
  stacks call the packets (``_c10d_functional.all_reduce``, as Dynamo traces them on torch
  2.13), so the copy calls each packet's ``default`` overload;
- it reads every node's fake value (``meta["val"]``, for its memory budget): the copy is
  propagated with `torch.fx.passes.fake_tensor_prop.FakeTensorProp` from the example inputs;
- it assumes a functional graph (Inductor runs it before re-inplacing), so an order follows
  only the FX edges; the stacks write in place (attention into an ``out`` buffer, captures
  into a slice of ``dest``), so the storage hazards of `msched.build_dag` (read after write,
  write after read or write) are added to the copy as an extra keyword argument of the later
  node, taken off again after the pass (without them its order reads attention's output
  before attention runs);
- with ``compute_estimator="analytical"`` and ``collective_estimator="analytical"`` nothing
  is benchmarked, but it still prices every compute node by the roofline
  (``estimate_roofline_runtime_ms``: Triton's GPU peak FLOPs and DRAM bandwidth, absent on a
  CPU) before the custom cost replaces the figure, logs each compute node's FLOPs by calling
  its op on the fake values (``node_runtime_estimation._log_compute_estimations``, which the
  extra keyword argument breaks) and the collectives' NCCL estimates
  (``_log_collective_benchmarks``), and asks ``torch.distributed.get_world_size()`` (needs a
  process group): for the pass only, the roofline answers 0, the two logs do nothing and the
  world size is the stacks' 2.  A torch without the pass or these names prints "-" in the
  PyTorch columns and why under the table.

Every other argument is the pass's default (no bucketing, 1 GB over the original peak
allowed).  PyTorch's order is checked with `msched.verify` against the original graph; a
violation is printed under the table.  No timing: these are cost-model units.

Run: ``python benchmarks/bench_comm.py [--layers 2] [--streams 1,2,3] [--comm 30]
[--time-limit 10]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch._ops import OpOverloadPacket
from torch.fx import Graph, GraphModule, Node

import msched
from msched.analysis.dag import DATA, RAW, WAR, WAW
from msched.models.decoders import DecoderStack, decoder_stack

#: The keyword argument that carries `storage_hazards` into the pass's copy.
AFTER = "_msched_after"
#: The world size the pass is told (the stacks are rank 0 of 2).
WORLD = 2


def graphs(layers: int) -> dict[str, Callable[[], Stack]]:
    def stack(**kwargs: Any) -> Callable[[], Stack]:
        return lambda: decoder_stack(layers, tuple(range(layers)), rank=0, **kwargs)

    return {
        "tp": stack(tp=2),
        "tp-2mb": stack(tp=2, microbatches=2),
        "ep-moe": stack(moe=True, ep=2),
    }


#: The sharded Llama's row name; a tiny random config (no weights), two decoder layers.
LLAMA = "llama-tp"
LLAMA_CONFIG = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
LLAMA_TOKENS = 6
ALL_REDUCE = torch.ops._c10d_functional.all_reduce.default


@dataclass
class Captured:
    """A graph and its example inputs: what `row` and `pytorch_row` take of a stack."""

    gm: GraphModule
    inputs: list[torch.Tensor]

    def example_inputs(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.inputs]


#: What a row is built from: one of msched's stacks or a captured graph.
Stack = DecoderStack | Captured


class _Column(nn.Module):
    """Rank 0's block of ``linear``'s output features (rows of its weight)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(WORLD, 0)[0].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


class _Row(nn.Module):
    """Rank 0's block of ``linear``'s input features, its partial sum all-reduced."""

    def __init__(self, linear: nn.Linear, group: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(WORLD, 1)[0].clone())
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        reduced = torch.ops._c10d_functional.all_reduce(partial, "sum", self.group)
        return torch.ops._c10d_functional.wait_tensor(reduced)


def sharded_llama() -> tuple[Captured, int] | str:
    """The largest AOT (aten-level) graph Dynamo captures of a tiny random ``transformers``
    Llama's forward, sharded tensor parallel by hand on rank 0 of 2 (``q/k/v/gate/up`` by
    output features, ``o/down`` by input features with a functional all-reduce), and how
    many graphs Dynamo made; or why not (no ``transformers``).  Needs a default process
    group (`fake_group`)."""
    try:
        import transformers
    except ImportError:
        return f"{LLAMA}: skipped, transformers is not installed (pip install transformers)"
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_CONFIG)).eval()
    group = torch.distributed.distributed_c10d._get_default_group().group_name
    for layer in lm.model.layers:
        for path in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            _replace(layer, path, _Column(layer.get_submodule(path)))
        for path in ("mlp.gate_proj", "mlp.up_proj"):
            _replace(layer, path, _Column(layer.get_submodule(path)))
        for path in ("self_attn.o_proj", "mlp.down_proj"):
            _replace(layer, path, _Row(layer.get_submodule(path), group))
    captured: list[Captured] = []

    def keep(gm: GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        inputs = [_real(node) for node in gm.graph.find_nodes(op="placeholder")]
        captured.append(Captured(gm, inputs))
        return gm.forward

    ids = torch.randint(0, LLAMA_CONFIG["vocab_size"], (1, LLAMA_TOKENS),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(lm, backend=aot_autograd(fw_compiler=keep), fullgraph=False)
    with torch.no_grad():
        compiled(input_ids=ids, use_cache=False)
    largest = max(captured, key=lambda c: len(c.gm.graph.nodes))
    return largest, len(captured)


def _replace(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent), name, module)


def _real(node: Node) -> torch.Tensor:
    """A real tensor like a placeholder's fake value (seeded; zeros for integers)."""
    val = node.meta["val"]
    if val.dtype.is_floating_point:
        gen = torch.Generator().manual_seed(len(node.name))
        return torch.randn(val.shape, dtype=val.dtype, generator=gen)
    return torch.zeros(val.shape, dtype=val.dtype)


@contextmanager
def fake_group() -> Iterator[None]:
    """A default process group of 2 ranks whose collectives do nothing (this is rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield
    finally:
        dist.destroy_process_group()


def copies(captured: Captured) -> Callable[[], Stack]:
    """A fresh copy of ``captured``'s graph per call (`row` schedules it in place)."""

    def build() -> Captured:
        graph = Graph()
        graph.output(graph.graph_copy(captured.gm.graph, {}))
        return Captured(GraphModule(captured.gm, graph), captured.inputs)

    return build


def optimum(
    build: Callable[[], Stack], streams: int, model: msched.CostModel, limit: float
) -> tuple[float, bool] | None:
    """The solver's makespan and whether it is proven; None without OR-Tools."""
    try:
        found = msched.optimal_makespan(build().gm, streams, model, time_limit=limit)
    except msched.MissingDependencyError:
        return None
    return found.makespan, found.proven


def row(
    build: Callable[[], Stack], streams: int, model: msched.CostModel
) -> tuple[list[float], msched.MemoryReport]:
    """msched's makespan, serial, ratio, bound, makespan over bound; its memory."""
    stack = build()
    gm = stack.gm
    sched = msched.schedule(gm, streams, cost_model=model)
    simulated = msched.simulate(gm, model).makespan
    if simulated != sched.makespan:
        raise SystemExit(f"simulated {simulated} != claimed {sched.makespan}")
    serial = msched.simulate(sched.original, model).makespan
    bound = sched.lower_bound
    memory = msched.peak_memory(gm, cost_model=model, example_inputs=stack.example_inputs())
    values = [sched.makespan, serial, sched.makespan / serial, bound, sched.makespan / bound]
    return values, memory


def storage_hazards(gm: GraphModule) -> dict[Node, list[Node]]:
    """Per node, the earlier nodes it must follow for a storage (read after write, write
    after read or write: `msched.build_dag`) and does not already take as an input."""
    dag = msched.build_dag(gm)
    hazards: dict[Node, list[Node]] = {}
    for node in dag.nodes:
        if node.op == "output":
            continue
        deps = [d for d, m in dag.preds[node].items() if m & (RAW | WAR | WAW) and not m & DATA]
        if deps:
            hazards[node] = deps
    return hazards


def call_overloads(gm: GraphModule) -> None:
    """Call the ``default`` overload of every ``_c10d_functional`` packet (the pass matches
    ``_c10d_functional.*.default`` only)."""
    for node in gm.graph.nodes:
        target = node.target
        if (
            isinstance(target, OpOverloadPacket)
            and "default" in target.overloads()
            and target.default.namespace == "_c10d_functional"
        ):
            node.target = target.default
    gm.recompile()


@contextmanager
def no_gpu_probes() -> Iterator[None]:
    """What `schedule_overlap_bucketing` probes beyond its custom costs, answered for a CPU
    and no process group (see the module docstring)."""
    from torch._inductor.fx_passes import node_runtime_estimation, overlap_scheduling

    with ExitStack() as stubs:
        stubs.enter_context(
            mock.patch.object(overlap_scheduling, "estimate_roofline_runtime_ms", lambda n: 0.0)
        )
        for log in ("_log_compute_estimations", "_log_collective_benchmarks"):
            stubs.enter_context(
                mock.patch.object(node_runtime_estimation, log, lambda *a, **k: None)
            )
        stubs.enter_context(
            mock.patch.object(torch.distributed, "get_world_size", lambda group=None: WORLD)
        )
        yield


def pytorch_order(stack: Stack, model: msched.CostModel) -> GraphModule:
    """``stack``'s graph in the order of PyTorch's ``schedule_overlap_bucketing`` given
    ``model``'s costs (the adaptations: the module docstring)."""
    from torch._inductor.fx_passes.overlap_scheduling import schedule_overlap_bucketing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = stack.gm
    call_overloads(gm)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(
        *stack.example_inputs()
    )
    costs = {node: model.cost(node) for node in gm.graph.nodes}
    hazards = storage_hazards(gm)
    for node, deps in hazards.items():
        node.kwargs = {**node.kwargs, AFTER: tuple(deps)}
    with no_gpu_probes():
        ordered = schedule_overlap_bucketing(
            gm,
            custom_runtime_estimation=lambda node, _size: costs.get(node),
            collective_estimator="analytical",
            compute_estimator="analytical",
        )
    for node in hazards:
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != AFTER}
    ordered.recompile()
    return ordered


def pytorch_row(
    build: Callable[[], Stack], model: msched.CostModel
) -> tuple[float, msched.MemoryReport, str] | str:
    """PyTorch's order's makespan and memory, and `msched.verify`'s verdict on it ("" when
    it verifies); or why the pass cannot run here (a torch without it or with other
    internals than those stubbed)."""
    stack = build()
    try:
        ordered = pytorch_order(stack, model)
    except (ImportError, AttributeError) as error:
        return f"PyTorch's pass cannot run with torch {torch.__version__}: {error!r}"
    makespan = msched.simulate(ordered, model).makespan
    memory = msched.peak_memory(ordered, cost_model=model, example_inputs=stack.example_inputs())
    report = msched.verify(ordered, original=build().gm)
    return makespan, memory, "" if report.ok else str(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="layers of each stack")
    parser.add_argument("--streams", default="1,2,3", help="stream counts, comma-separated")
    parser.add_argument("--comm", type=float, default=msched.DefaultCostModel.COMM)
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    args = parser.parse_args()
    model = msched.DefaultCostModel(comm=args.comm)
    counts = [int(s) for s in args.streams.split(",")]
    print(f"communication {args.comm:g} per collective, matmul 10 (msched.DefaultCostModel)")
    print(fmt(HEADER))
    notes: dict[str, None] = {}  # in order, once each
    with ExitStack() as scope:
        builds = graphs(args.layers)
        scope.enter_context(fake_group())
        llama = sharded_llama()
        if isinstance(llama, str):
            notes[llama] = None
        else:
            builds[LLAMA] = copies(llama[0])
            graph, made = llama
            reduces = len(graph.gm.graph.find_nodes(op="call_function", target=ALL_REDUCE))
            notes[
                f"{LLAMA}: the largest of the {made} graph(s) Dynamo made of the sharded Llama's"
                f" forward, {reduces} all-reduces (AOT, aten-level)"
            ] = None
        table(builds, counts, model, args.time_limit, notes)
    for note in notes:
        print(note)


def table(
    builds: dict[str, Callable[[], Stack]],
    counts: list[int],
    model: msched.CostModel,
    limit: float,
    notes: dict[str, None],
) -> None:
    """Print a row per graph and stream count; a note per graph PyTorch's pass fails."""
    for name, build in builds.items():
        theirs = pytorch_row(build, model)
        if isinstance(theirs, str):
            notes[theirs] = None
        elif theirs[2]:
            notes[f"{name}: PyTorch's order fails msched.verify: {theirs[2]}"] = None
        for k in counts:
            values, memory = row(build, k, model)
            cells = [
                name,
                str(k),
                *(f"{v:.3f}" if i in (2, 4) else f"{v:g}" for i, v in enumerate(values)),
                *optimum_cells(optimum(build, k, model, limit), values[0]),
                *pytorch_cells(theirs, values[0], memory),
            ]
            print(fmt(cells))


HEADER = ["graph", "streams", "makespan", "serial", "ratio", "bound", "makespan/lb"]
HEADER += ["optimum", "makespan/opt", "pytorch", "msched/pytorch"]
HEADER += ["alloc-KiB", "pytorch-KiB", "bound-MiB", "pytorch-bound-MiB"]


def fmt(cells: list[str]) -> str:
    return "".join(f"{c:>{max(len(h), 7) + 2}}" for c, h in zip(cells, HEADER, strict=True))


def optimum_cells(found: tuple[float, bool] | None, makespan: float) -> list[str]:
    if found is None:
        return ["-", "-"]
    best, proven = found
    return [f"{best:g}" + ("" if proven else "*"), f"{makespan / best:.3f}"]


def pytorch_cells(
    theirs: tuple[float, msched.MemoryReport, str] | str,
    makespan: float,
    ours: msched.MemoryReport,
) -> list[str]:
    kib, mib = 1024, 1024 * 1024
    if isinstance(theirs, str):  # the pass did not run: msched's memory alone
        return ["-", "-", f"{ours.allocated / kib:g}", "-", f"{ours.reserved_bound / mib:g}", "-"]
    their_makespan, memory, _verdict = theirs
    return [
        f"{their_makespan:g}",
        f"{makespan / their_makespan:.3f}",
        f"{ours.allocated / kib:g}",
        f"{memory.allocated / kib:g}",
        f"{ours.reserved_bound / mib:g}",
        f"{memory.reserved_bound / mib:g}",
    ]


if __name__ == "__main__":
    main()
