"""Properties of `msched.schedule` over generated graphs, checked by `verify` and `execute`.

The number of examples comes from the hypothesis profile (registered in the top-level
conftest.py): ``default`` runs 100, ``ci`` (``--slow``, as CI runs) 500, ``long``
(``MSCHED_HYPOTHESIS_PROFILE=long``) 10,000.

Generated graphs may write a buffer of their module (``buf``): every run starts from the
buffers as generated, and the buffers it leaves must equal those of the eager run.
"""

from __future__ import annotations

import builtins
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import given, settings
from torch.fx import GraphModule

import msched
import msched.testing.strategies as mst

from .faults import copy_module
from .measured import one_pool_segments

ORDERS = ("late-aux", "early-aux", "random")


def same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN (an eager run can produce NaN too)."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(), b.nan_to_num())
        )
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def buffers(gm: GraphModule) -> dict[str, torch.Tensor]:
    """Clones of the module's buffers and parameters (its state)."""
    return {k: v.clone() for k, v in gm.state_dict().items()}


def restore(gm: GraphModule, state: dict[str, torch.Tensor]) -> None:
    gm.load_state_dict(state)


def compute_names(gm: GraphModule) -> list[str]:
    stream_ops = set(msched.ops.STREAM_OPS)
    return sorted(n.name for n in gm.graph.nodes if n.target not in stream_ops)


@given(mst.graphs(), mst.stream_counts())
def test_schedules_of_generated_graphs_are_correct(gm: GraphModule, streams: int) -> None:
    initial = buffers(gm)
    inputs = mst.example_inputs(gm)
    expected = copy_module(gm)(*inputs)  # eager, unscheduled; mutates ``inputs`` (and buffers)
    expected_buffers = buffers(gm)
    names = compute_names(gm)
    sched = msched.schedule(gm, streams)
    report = msched.verify(gm, original=sched.original, num_streams=streams)
    assert report.ok, str(report)
    assert msched.verify(gm).ok
    assert compute_names(gm) == names
    for order in ORDERS:
        restore(gm, initial)
        fresh = mst.example_inputs(gm)
        run = msched.execute(gm, *fresh, order=order, seed=streams)
        assert run.after_output == (), order  # output joins everything
        assert same(run.output, expected), order
        assert same(run.inputs_at_output, inputs), order  # every write joined before output
        assert same(fresh, inputs), order
        assert same(buffers(gm), expected_buffers), order
    restore(gm, initial)
    fresh = mst.example_inputs(gm)
    assert same(gm(*fresh), expected)  # the scheduled module, called plainly
    assert same(fresh, inputs) and same(buffers(gm), expected_buffers)


@given(mst.graphs(), mst.stream_counts())
def test_schedules_of_generated_graphs_are_capture_safe(gm: GraphModule, streams: int) -> None:
    """msched's FX schedules can be captured as CUDA graphs by construction: every side stream
    joins stream 0 before its first node and is joined before output, with no host sync."""
    sched = msched.schedule(gm, streams)
    report = msched.verify(gm, original=sched.original, cuda_graph=True)
    assert report.ok, str(report)


def _has(target: Any, op: str = "call_function") -> Callable[[GraphModule], bool]:
    return lambda gm: any(n.op == op and n.target == target for n in gm.graph.nodes)


def _out_call(fn: Any) -> Callable[[GraphModule], bool]:
    return lambda gm: any(n.target is fn and "out" in n.kwargs for n in gm.graph.nodes)


def _features() -> dict[str, Callable[[GraphModule], bool]]:
    aten = torch.ops.aten
    targets = (
        aten.mm.default,
        aten.tanh.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.copy_.default,
        aten.add_.Tensor,
        torch.ops.msched.inplace_slice_copy.default,
    )
    features = {str(t): _has(t) for t in targets}
    features["get_attr"] = lambda gm: any(n.op == "get_attr" for n in gm.graph.nodes)
    for method in ("mul", "add", "neg", "mul_", "add_", "copy_"):
        features[f"x.{method}()"] = _has(method, "call_method")
    for module in ("lin", "relu", "relu_inplace"):
        features[f"self.{module}()"] = _has(module, "call_module")
    for attr in ("T", "mT"):
        features[f"x.{attr} written"] = written_through_getattr(attr)
        features[f"x.{attr} read"] = read_through_getattr(attr)
    for fn in (torch.mul, torch.add):
        features[f"torch.{fn.__name__}(out=)"] = _out_call(fn)
    features["buf written and read through other get_attrs"] = (
        buffer_written_and_read_through_other_get_attrs
    )
    return features


def test_the_strategy_draws_every_feature() -> None:
    # One pass over examples (``find`` per feature would shrink each one: much slower).
    features = _features()
    seen: set[str] = set()

    @settings(max_examples=300)
    @given(mst.graphs())
    def collect(gm: GraphModule) -> None:
        seen.update(name for name, present in features.items() if present(gm))

    collect()
    assert not set(features) - seen, f"never drawn: {sorted(set(features) - seen)}"


def writes_first_argument(node: torch.fx.Node) -> bool:
    """An in-place method (``x.mul_(y)``) or an aten op whose schema writes ``self``."""
    if node.op == "call_method":
        return str(node.target).endswith("_")
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    first = target._schema.arguments[0].alias_info
    return first is not None and first.is_write


def written_through_getattr(attr: str) -> Callable[[GraphModule], bool]:
    def check(gm: GraphModule) -> bool:
        return any(
            n.target is builtins.getattr
            and n.args[1] == attr
            and any(writes_first_argument(u) for u in n.users)
            for n in gm.graph.nodes
        )

    return check


def read_through_getattr(attr: str) -> Callable[[GraphModule], bool]:
    def check(gm: GraphModule) -> bool:
        return any(
            n.target is builtins.getattr
            and n.args[1] == attr
            and not any(writes_first_argument(u) for u in n.users)
            for n in gm.graph.nodes
        )

    return check


def buffer_written_and_read_through_other_get_attrs(gm: GraphModule) -> bool:
    """``buf`` is written through one ``get_attr`` node and read through another."""
    accesses = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target == "buf"]
    writers = {n for n in accesses if any(writes_first_argument(u) for u in n.users)}
    return bool(writers) and bool(set(accesses) - writers)


def test_importing_msched_does_not_import_hypothesis() -> None:
    code = "import sys, msched; assert 'hypothesis' not in sys.modules, 'hypothesis imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@given(mst.graphs(), mst.stream_counts())
def test_peak_memory_of_generated_schedules_is_ordered_and_one_stream_is_one_pool(
    gm: GraphModule, streams: int
) -> None:
    """``allocated <= reserved <= reserved_bound`` on any schedule; on one stream the three
    are what one pool counts on a real CPU run: ``allocated`` its peak of live blocks,
    ``reserved`` and ``reserved_bound`` (equal) its segments."""
    inputs = mst.example_inputs(gm)
    msched.schedule(gm, streams)
    report = msched.peak_memory(gm, example_inputs=inputs)
    assert report.allocated <= report.reserved <= report.reserved_bound
    if streams == 1:
        assert one_pool_segments(gm, *inputs) == (report.allocated, report.reserved)
        assert report.reserved == report.reserved_bound
