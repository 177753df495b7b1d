"""Measured costs: `measure_costs` times every node of a graph where it runs, and
`MeasuredCostModel` keeps the times, in microseconds, in a small JSON file.

Why: an engine profiles its graph once on its GPU, commits the file, and CI (on CPU) schedules
with the GPU's costs.  The file (`FORMAT`, version `VERSION`) holds::

    {"format": "msched-costs", "version": 1, "unit": "us",
     "torch": "2.13.0", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3",
     "warmup": 3, "repeats": 10,
     "nodes": {"x": 0.0, "mm": 12.5, ...}, "ops": {"aten.mm.default": 12.5, ...}}

``nodes`` is every node's median time by name, ``ops`` the median of those times over the
nodes that run each op (by `msched.analysis.cost_table.op_keys`' most specific name), so a
graph traced again with other node names still finds its ops.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from msched.analysis.cost import CostModel, RooflineCostModel, _is_free
from msched.analysis.cost_table import TableCostModel, op_keys
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError

#: The ``format`` of a cost file, and the newest ``version`` this msched reads and writes.
FORMAT = "msched-costs"
VERSION = 1
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
    ``repeats`` how.  `measure_costs` makes one; `save` and `load` write and read its file.
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
        base: CostModel | None = None,
    ) -> None:
        for setting, value in (("device", device), ("device_name", device_name)):
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{setting} must be a string, got {value!r}")
        if not isinstance(torch_version, str):
            raise InvalidArgumentError(f"torch_version must be a string, got {torch_version!r}")
        _check_counts(warmup, repeats)
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
        `msched.InvalidArgumentError` naming the file and what is wrong."""
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
    for key in ("nodes", "ops"):
        if not isinstance(data.get(key), dict):
            raise InvalidArgumentError(f"{key!r} must be an object of costs")
        fields[key] = data[key]
    return fields


def _check_version(version: object) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgumentError(f"bad version {version!r}")
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
    """Run ``gm`` on ``inputs`` once, node by node, timing each node where it runs; return
    the median times as a `MeasuredCostModel` (microseconds).

    Why: the table and roofline models guess; a schedule is only as good as its costs, and
    the costs of one engine's kernels on one GPU are measured best on that GPU.

    1. ``device`` (default: the device of the first tensor among ``inputs``, else of
       ``gm``'s first parameter or buffer, else the CPU): when given, ``gm`` is moved there
       in place (``nn.Module.to``) and the tensors of ``inputs`` are copied there.
    2. Each node, in graph order, is called ``warmup`` times untimed, then ``repeats`` times
       timed; its cost is the median.  On a CUDA device CUDA events time each call (the
       kernels' time on the stream); elsewhere the host clock ``clock`` does
       (`time.perf_counter_ns` unless given; a given ``clock`` is used on CUDA too).
    3. Graph inputs, ``output``, views, ``getitem``, metadata reads and symbolic ints cost 0
       and run once, untimed (they launch no kernel).
    4. An op's cost is the median of its nodes' costs.

    The nodes run under the caller's grad mode (wrap the call in ``torch.no_grad()`` for
    inference costs).  A node that writes its inputs in place writes them
    ``warmup + repeats`` times.  A graph with collectives needs its process group, as when it
    runs.  ``warmup`` must be an int >= 0 and ``repeats`` an int >= 1.
    """
    _check_counts(warmup, repeats)
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(f"measure_costs needs a GraphModule, got {type(gm).__name__}")
    where = _device_of(gm, inputs) if device is None else torch.device(device)
    if device is not None:
        gm.to(where)
        inputs = [x.to(where) if isinstance(x, torch.Tensor) else x for x in inputs]
    timer = _Timer(gm, warmup, repeats, _call_timer(where, clock))
    timer.run(*inputs)
    nodes = {n.name: round(timer.times.get(n, 0.0), _DIGITS) for n in gm.graph.nodes}
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
        warmup=warmup, repeats=repeats,
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


# Runs a call once and returns (its result, how long it took in microseconds).
_CallTimer = Callable[[Callable[[], Any]], tuple[Any, float]]


def _call_timer(device: torch.device, clock: Clock | None) -> _CallTimer:
    if device.type == "cuda" and clock is None:
        return _cuda_timer
    read = clock or time.perf_counter_ns

    def timed(call: Callable[[], Any]) -> tuple[Any, float]:
        start = read()
        result = call()
        return result, (read() - start) / 1000.0

    return timed


def _cuda_timer(call: Callable[[], Any]) -> tuple[Any, float]:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    result = call()
    end.record()
    end.synchronize()
    return result, start.elapsed_time(end) * 1000.0  # milliseconds to microseconds


class _Timer(Interpreter):
    """An interpreter that times the calls of the nodes that launch work (`measure_costs`)."""

    def __init__(self, gm: GraphModule, warmup: int, repeats: int, timer: _CallTimer) -> None:
        super().__init__(gm)
        self.warmup, self.repeats, self.timer = warmup, repeats, timer
        self.times: dict[Node, float] = {}

    def run_node(self, n: Node) -> Any:
        if n.op in INPUT_OPS or n.op == "output" or _is_free(n):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        method = getattr(self, n.op)

        def call() -> Any:
            return method(n.target, args, kwargs)

        for _ in range(self.warmup):
            call()
        samples = []
        result = None
        for _ in range(self.repeats):
            result, took = self.timer(call)
            samples.append(max(took, 0.0))
        median = statistics.median(samples)
        self.times[n] = median if math.isfinite(median) else 0.0
        return result
