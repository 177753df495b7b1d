"""Properties of `msched.schedule` over generated graphs, checked by `verify` and `execute`.

The number of examples comes from the hypothesis profile (``MSCHED_HYPOTHESIS_PROFILE``,
registered in the top-level conftest.py): ``ci`` runs 500, ``long`` 10,000.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import torch
from hypothesis import find, given
from torch.fx import GraphModule

import msched
import msched.strategies as mst

from .faults import copy_module

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
    return bool(a == b)


def compute_names(gm: GraphModule) -> list[str]:
    stream_ops = set(msched.ops.STREAM_OPS)
    return sorted(n.name for n in gm.graph.nodes if n.target not in stream_ops)


@given(mst.graphs(), mst.stream_counts())
def test_schedules_of_generated_graphs_are_correct(gm: GraphModule, streams: int) -> None:
    inputs = mst.example_inputs(gm)
    expected = copy_module(gm)(*inputs)  # eager, unscheduled; mutates ``inputs``
    names = compute_names(gm)
    sched = msched.schedule(gm, streams)
    report = msched.verify(gm, original=sched.original, num_streams=streams)
    assert report.ok, str(report)
    assert msched.verify(gm).ok
    assert compute_names(gm) == names
    for order in ORDERS:
        fresh = mst.example_inputs(gm)
        run = msched.execute(gm, *fresh, order=order, seed=streams)
        assert same(run.output, expected), order
        assert same(run.inputs_at_output, inputs), order  # every write joined before output
        assert same(fresh, inputs), order


def test_the_strategy_draws_every_feature() -> None:
    def has(target: Any) -> Any:
        return lambda gm: any(n.target is target for n in gm.graph.nodes)

    aten = torch.ops.aten
    for target in (
        aten.mm.default,
        aten.tanh.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.copy_.default,
        aten.add_.Tensor,
        torch.ops.msched.inplace_slice_copy.default,
    ):
        find(mst.graphs(), has(target))
    find(mst.graphs(), lambda gm: any(n.op == "get_attr" for n in gm.graph.nodes))


def test_importing_msched_does_not_import_hypothesis() -> None:
    code = "import sys, msched; assert 'hypothesis' not in sys.modules, 'hypothesis imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
