"""Measured costs: `measure_costs` times every node of a graph where it runs, and
`MeasuredCostModel` keeps the times, in microseconds, in a small JSON file.

Why: an engine profiles its graph once on its GPU, commits the file, and CI (on CPU) schedules
with the GPU's costs.  The file (`FORMAT`, version `VERSION`) holds::

    {"format": "msched-costs", "version": 2, "unit": "us",
     "torch": "2.13.0", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3",
     "warmup": 3, "repeats": 10, "overhead_us": 0.0,
     "nodes": {"x": 0.0, "mm": 12.5, ...}, "ops": {"aten.mm.default": 12.5, ...}}

``nodes`` is every node's median time by name, ``ops`` the median of those times over the
nodes that run each op (by `msched.analysis.cost_table.op_keys`' most specific name), so a
graph traced again with other node names still finds its ops.  ``overhead_us`` is the host
time per node that launches work which the forward spends outside its nodes (`measure_costs`,
step 4); it is added to the cost of every such node the file prices.  A version 1 file (no
``overhead_us``, nodes timed each on its own) still loads, with an overhead of 0.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.fx import GraphModule, Interpreter, Node

from msched.analysis.cost import CostModel, RooflineCostModel, _is_free, _setting
from msched.analysis.cost_table import TableCostModel, op_keys
from msched.analysis.nodes import INPUT_OPS
from msched.analysis.sizes import is_export_guard
from msched.errors import InvalidArgumentError

#: The ``format`` of a cost file, and the newest ``version`` this msched reads and writes.
FORMAT = "msched-costs"
VERSION = 2
#: The unit of every cost in a file and of `MeasuredCostModel`: microseconds.
UNIT = "us"
# Times are kept to the nanosecond, so a model and the model loaded from its file are equal.
_DIGITS = 3


class MeasuredCostModel(TableCostModel):
    """Measured microseconds by node name and by op (`TableCostModel`'s order: node name,
    op overload, op packet), everything else from ``base`` (`msched.RooflineCostModel` by
    default, which is in microseconds too).

    ``nodes`` and ``ops`` map node names and dotted op names to microseconds; ``device``,
    ``device_name`` and ``torch_version`` say where they were measured, ``warmup`` and
    ``repeats`` how.  ``overhead_us`` (finite, >= 0) is added to the entry of every node that
    launches work (not a graph input, ``output``, view, ``getitem``, metadata read or
    symbolic int): the host time per node that the forward spends between its nodes.
    `measure_costs` makes one; `save` and `load` write and read its file.
    """

    def __init__(
        self,
        nodes: Mapping[str, float],
        ops: Mapping[str, float],
        *,
        device: str,
        device_name: str,
        torch_version: str,
        warmup: int,
        repeats: int,
        overhead_us: float = 0.0,
        base: CostModel | None = None,
    ) -> None:
        for setting, value in (("device", device), ("device_name", device_name)):
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{setting} must be a string, got {value!r}")
        if not isinstance(torch_version, str):
            raise InvalidArgumentError(f"torch_version must be a string, got {torch_version!r}")
        _check_counts(warmup, repeats)
        self.overhead_us = _setting("overhead_us", overhead_us)
        for name in nodes:
            if not isinstance(name, str) or "." in name or "::" in name:
                raise InvalidArgumentError(f"{name!r} in nodes is not a node name")
        for name in ops:
            if not isinstance(name, str) or "." not in name.replace("::", "."):
                raise InvalidArgumentError(f"{name!r} in ops is not an op's dotted name")
        super().__init__({**ops, **nodes}, base if base is not None else RooflineCostModel())
        table = self.costs
        self.nodes = {name: cost for name, cost in table.items() if "." not in name}
        self.ops = {name: cost for name, cost in table.items() if "." in name}
        self.device, self.device_name, self.torch_version = device, device_name, torch_version
        self.warmup, self.repeats = warmup, repeats

    def cost(self, node: Node) -> float:
        """The table's entry for ``node``, plus ``overhead_us`` when it launches work; the
        base model's cost when the table has no entry."""
        value = self._entry(node)
        if value is None:
            return self.base.cost(node)
        if self.overhead_us and _launches_work(node):
            return value + self.overhead_us
        return value

    def to_json(self) -> dict[str, Any]:
        """The file's content (see the module docstring)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "unit": UNIT,
            "torch": self.torch_version,
            "device": self.device,
            "device_name": self.device_name,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "overhead_us": self.overhead_us,
            "nodes": self.nodes,
            "ops": self.ops,
        }

    def save(self, path: str | Path) -> None:
        """Write the model to ``path`` as JSON (deterministic: the same model, the same
        bytes)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, base: CostModel | None = None) -> MeasuredCostModel:
        """The model saved at ``path``, with ``base`` for the nodes it does not name.

        A file that is not JSON, not a cost file (another ``format``), of a newer ``version``
        than `VERSION`, in another unit or with a bad field is an
        `msched.InvalidArgumentError` naming the file and what is wrong.  A version 1 file
        loads with ``overhead_us`` 0 (it had none); `save` writes the current version."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidArgumentError(f"cannot read the cost file {str(path)!r}: {e}") from e
        try:
            return cls(**_fields(data), base=base)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"cost file {str(path)!r}: {e}") from e


def _fields(data: object) -> dict[str, Any]:
    """`MeasuredCostModel`'s arguments from a file's JSON, checked."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidArgumentError(f'not an msched cost file (no "format": {FORMAT!r})')
    _check_version(data.get("version"))
    if data.get("unit") != UNIT:
        raise InvalidArgumentError(f"unit {data.get('unit')!r}, expected {UNIT!r}")
    fields: dict[str, Any] = {}
    for key, name in (("torch", "torch_version"), ("device", "device"), ("device_name", "")):
        if not isinstance(data.get(key), str):
            raise InvalidArgumentError(f"{key!r} must be a string, got {data.get(key)!r}")
        fields[name or key] = data[key]
    _check_counts(data.get("warmup"), data.get("repeats"), quote="'")
    fields.update(warmup=data["warmup"], repeats=data["repeats"])
    if data["version"] >= 2:
        fields["overhead_us"] = _setting("'overhead_us'", data.get("overhead_us"))
    for key in ("nodes", "ops"):
        if not isinstance(data.get(key), dict):
            raise InvalidArgumentError(f"{key!r} must be an object of costs")
        fields[key] = data[key]
    return fields


def _check_version(version: object) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgumentError(f"'version' must be an int from 1 to {VERSION}, got {version!r}")
    if version > VERSION:
        raise InvalidArgumentError(
            f"version {version} is newer than this msched reads ({VERSION}); upgrade msched"
        )


#: ``clock``: a monotonic clock in integer nanoseconds, as `time.perf_counter_ns`.
Clock = Callable[[], int]


def measure_costs(
    gm: GraphModule,
    inputs: Sequence[Any],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: str | torch.device | None = None,
    clock: Clock | None = None,
) -> MeasuredCostModel:
    """Run ``gm`` on ``inputs`` node by node, timing each node where it runs, in the
    context of the whole forward; return the median times as a `MeasuredCostModel`
    (microseconds).

    Why: the table and roofline models guess; a schedule is only as good as its costs, and
    the costs of one engine's kernels on one GPU are measured best on that GPU.  A node
    timed over and over on its own runs with warm caches and without the host's work
    between nodes, so on a CPU such times added up to about half of a forward; timed in
    the forward, with the host's share added, they add up to it.

    1. ``device`` (default: the device of the first tensor among ``inputs``, else of
       ``gm``'s first parameter or buffer, else the CPU): when given, ``gm`` is moved there
       in place (``nn.Module.to``) and the tensors of ``inputs`` are copied there.
    2. A pass runs the whole graph in order, as its generated code does (each value freed
       after its last use), reading a stopwatch just before and after each node that
       launches work, so the node meets the caches its predecessors leave.  ``warmup``
       passes are untimed, then ``repeats`` are timed; a node's cost is the median of its
       times.  On a CUDA device CUDA events time each node (its kernels' time on the
       stream, read once a pass has ended); elsewhere the host clock ``clock`` does
       (`time.perf_counter_ns` unless given; a given ``clock`` is used on CUDA too).
    3. Graph inputs, ``output``, views, ``getitem``, metadata reads and symbolic ints cost 0
       and are not timed (they launch no kernel).
    4. With a host clock, each pass is followed by one call of ``gm`` itself (its generated
       code), timed whole.  ``overhead_us`` is (the median forward - the sum of the nodes'
       medians) / the timed nodes, at least 0: the Python between nodes, freeing values and
       whatever else a forward pays outside its nodes, shared evenly (it is mostly a fixed
       price per op).  The model adds it to each timed node's cost.  With CUDA events it is
       0: the costs are the device's time, which is what streams overlap; the host's
       launches are not device time (and an engine's CUDA graphs remove them).
    5. An op's cost is the median of its nodes' costs (without ``overhead_us``).

    The nodes run under the caller's grad mode (wrap the call in ``torch.no_grad()`` for
    inference costs).  A node that writes its inputs in place writes them once per pass and
    forward.  A graph with collectives needs its process group, as when it runs.
    ``warmup`` must be an int >= 0 and ``repeats`` an int >= 1.
    """
    _check_counts(warmup, repeats)
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(f"measure_costs needs a GraphModule, got {type(gm).__name__}")
    if not isinstance(inputs, (list, tuple)):  # a lone tensor would be unpacked by its rows
        raise InvalidArgumentError(
            "measure_costs needs the graph's inputs as a tuple or list (one item per input), "
            f"got {type(inputs).__name__}: write (x,) for one input"
        )
    where = _device_of(gm, inputs) if device is None else torch.device(device)
    if device is not None:
        gm.to(where)
        inputs = [x.to(where) if isinstance(x, torch.Tensor) else x for x in inputs]
    if where.type == "cuda" and clock is None:
        stopwatch: _Stopwatch = _EventStopwatch(torch.cuda.Event)
    else:
        stopwatch = _ClockStopwatch(clock or time.perf_counter_ns)
    times, overhead = _measure(gm, inputs, warmup, repeats, stopwatch)
    nodes = {n.name: round(times.get(n, 0.0), _DIGITS) for n in gm.graph.nodes}
    by_op: dict[str, list[float]] = {}
    for node in gm.graph.nodes:
        keys = op_keys(node)
        if keys:
            by_op.setdefault(keys[0], []).append(nodes[node.name])
    ops = {key: round(statistics.median(times), _DIGITS) for key, times in by_op.items()}
    if where.type == "cuda":
        name = torch.cuda.get_device_name(where)
    else:
        name = platform.processor() or platform.machine() or where.type
    return MeasuredCostModel(
        nodes, ops, device=str(where), device_name=name, torch_version=str(torch.__version__),
        warmup=warmup, repeats=repeats, overhead_us=round(overhead, _DIGITS),
    )  # fmt: skip


def _check_counts(warmup: object, repeats: object, quote: str = "") -> None:
    """``warmup`` an int >= 0 and ``repeats`` an int >= 1, else `msched.InvalidArgumentError`
    (the names in ``quote`` marks: they are the file's fields)."""
    for name, value, least in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InvalidArgumentError(
                f"{quote}{name}{quote} must be an int >= {least}, got {value!r}"
            )


def _device_of(gm: GraphModule, inputs: Sequence[Any]) -> torch.device:
    """Where ``gm`` runs: its first tensor input's device, else its first parameter's or
    buffer's, else the CPU."""
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    for t in (*gm.parameters(), *gm.buffers()):
        return t.device
    return torch.device("cpu")


def _launches_work(node: Node) -> bool:
    """Whether ``node`` is timed (`measure_costs`, step 3) and pays ``overhead_us``."""
    return not (
        node.op in INPUT_OPS or node.op == "output" or _is_free(node) or is_export_guard(node)
    )


def _measure(
    gm: GraphModule, inputs: Sequence[Any], warmup: int, repeats: int, stopwatch: _Stopwatch
) -> tuple[dict[Node, float], float]:
    """Each timed node's median microseconds over ``repeats`` passes after ``warmup``, and
    the host overhead per timed node (`measure_costs`, steps 2 and 4)."""
    timer = _Timer(gm, stopwatch)
    clock = stopwatch.clock
    passes: list[dict[Node, float]] = []
    forwards: list[float] = []
    for i in range(warmup + repeats):
        timer.run(*inputs)
        laps = stopwatch.laps()
        took = None if clock is None else _forward_us(gm, inputs, clock)
        if i >= warmup:
            passes.append(laps)
            if took is not None:
                forwards.append(took)
    medians = {n: _median([laps[n] for laps in passes]) for n in timer.timed}
    if not forwards or not medians:
        return medians, 0.0
    spare = _median(forwards) - sum(medians.values())
    return medians, max(spare, 0.0) / len(medians)


def _forward_us(gm: GraphModule, inputs: Sequence[Any], clock: Clock) -> float:
    """Microseconds of one call of ``gm`` itself (its generated code), by ``clock``."""
    start = clock()
    gm(*inputs)
    return (clock() - start) / 1000.0


def _median(samples: list[float]) -> float:
    """The median of ``samples`` clamped at 0, and 0 for a NaN."""
    median = statistics.median(max(sample, 0.0) for sample in samples)
    return median if math.isfinite(median) else 0.0


class _Stopwatch(Protocol):
    """Times the nodes of one pass: ``stop(node, start())`` around each node's call, then
    ``laps()``, each node's microseconds, once the pass has ended (and forgets them)."""

    #: The host clock that times the forward, None when the stopwatch has none.
    clock: Clock | None

    def start(self) -> Any: ...

    def stop(self, node: Node, start: Any) -> None: ...

    def laps(self) -> dict[Node, float]: ...


class _ClockStopwatch:
    """A host clock's readings (nanoseconds) around each node."""

    def __init__(self, clock: Clock) -> None:
        self.clock: Clock | None = clock
        self._read = clock
        self._laps: dict[Node, float] = {}

    def start(self) -> int:
        return self._read()

    def stop(self, node: Node, start: Any) -> None:
        self._laps[node] = (self._read() - start) / 1000.0

    def laps(self) -> dict[Node, float]:
        laps, self._laps = self._laps, {}
        return laps


class _EventStopwatch:
    """CUDA events recorded around each node on its stream, read after one synchronize."""

    clock: Clock | None = None

    def __init__(self, event: Callable[..., Any]) -> None:
        self._event = event  # torch.cuda.Event; another class with its methods in tests
        self._pairs: dict[Node, tuple[Any, Any]] = {}

    def start(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        return event

    def stop(self, node: Node, start: Any) -> None:
        self._pairs[node] = (start, self.start())

    def laps(self) -> dict[Node, float]:
        pairs, self._pairs = self._pairs, {}
        if pairs:
            next(reversed(pairs.values()))[1].synchronize()
        # elapsed_time is in milliseconds
        return {n: start.elapsed_time(end) * 1000.0 for n, (start, end) in pairs.items()}


class _Timer(Interpreter):
    """An interpreter that runs the whole graph (each value freed after its last use, as
    the generated code frees it) and times the calls of the nodes that launch work."""

    def __init__(self, gm: GraphModule, stopwatch: _Stopwatch) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.stopwatch = stopwatch
        self.timed = [n for n in gm.graph.nodes if _launches_work(n)]
        self._timed = set(self.timed)

    def run_node(self, n: Node) -> Any:
        if n not in self._timed:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        method = getattr(self, n.op)
        start = self.stopwatch.start()
        result = method(n.target, args, kwargs)
        self.stopwatch.stop(n, start)
        return result
