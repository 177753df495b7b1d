"""Sharded decoder stacks (`decoder_stack(tp=, ep=, microbatches=)`): their collectives, as
Dynamo writes them, and their numbers on two real gloo ranks against the unsharded stack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import msched
from msched.models.decoders import decoder_stack
from tests.msched.models.sharded import CASES, SMALL, collective_host_order, run_unscheduled

c10d = torch.ops._c10d_functional


def _targets(stack: Any, target: object) -> list[Any]:
    return [n for n in stack.gm.graph.nodes if n.target is target]


@pytest.mark.parametrize(
    ("kwargs", "all_reduces", "all_to_alls"),
    [
        ({"tp": 2}, 4, 0),
        ({"moe": True, "ep": 2}, 0, 4),
        ({"microbatches": 2}, 0, 0),
        ({"tp": 2, "microbatches": 2}, 8, 0),
        ({"moe": True, "ep": 2, "microbatches": 2}, 0, 8),
        ({"tp": 2, "moe": True}, 4, 0),
    ],
    ids=["tp", "ep", "microbatches", "tp-mb", "ep-mb", "tp-moe"],
)
def test_each_collective_is_an_op_packet_then_its_wait(
    kwargs: dict[str, Any], all_reduces: int, all_to_alls: int
) -> None:
    stack = decoder_stack(**SMALL, **kwargs)  # no process group: building needs none
    reduces = _targets(stack, c10d.all_reduce)
    exchanges = _targets(stack, c10d.all_to_all_single)
    waits = _targets(stack, c10d.wait_tensor)
    assert (len(reduces), len(exchanges)) == (all_reduces, all_to_alls)
    assert [w.args[0] for w in waits] == [*collective_nodes(stack)]
    for node in reduces:
        assert node.args[1:] == ("sum", "0")
        assert [u.target for u in node.users] == [c10d.wait_tensor]
    for node in exchanges:
        assert node.args[1:] == ([4, 4], [4, 4], "0")
    assert collective_host_order(stack.gm) == [n.name for n in collective_nodes(stack)]


def collective_nodes(stack: Any) -> list[Any]:
    return [
        n for n in stack.gm.graph.nodes if n.target in (c10d.all_reduce, c10d.all_to_all_single)
    ]


def test_micro_batches_capture_into_their_own_rows() -> None:
    stack = decoder_stack(**SMALL, microbatches=2)
    assert [c.name for c in stack.captures] == [
        "mb0_capture_0",
        "mb1_capture_0",
        "mb0_capture_1",
        "mb1_capture_1",
    ]
    x, dest = stack.example_inputs()
    assert x.shape == (8, 8) and dest.shape == (8, 16)
    out, dest = stack.reference()
    want_out, want_dest = stack.unsharded_reference()
    assert torch.allclose(out, want_out, atol=1e-6) and torch.allclose(dest, want_dest, atol=1e-6)
    assert stack.layer_of["mb1_capture_1"] == 1


def test_the_shards_of_a_tp_stack_sum_to_the_unsharded_weights() -> None:
    whole = decoder_stack(**SMALL)
    parts = [decoder_stack(**SMALL, tp=2, rank=r) for r in (0, 1)]
    buffers = [dict(p.gm.named_buffers()) for p in parts]
    for name, value in whole.gm.named_buffers():
        if name.endswith(("_wo", "_wd")):
            assert torch.equal(torch.cat([b[name] for b in buffers], 0), value)
        elif name.endswith(("_wv", "_wg", "_wu")):
            assert torch.equal(torch.cat([b[name] for b in buffers], 1), value)
        else:
            assert all(torch.equal(b[name], value) for b in buffers)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 0}, "tp must be >= 1"),
        ({"tp": 3}, "tp=3 must divide hidden=8"),
        ({"ep": 2}, "pass moe=True"),
        ({"ep": 3, "moe": True}, "must divide the 4 experts"),
        ({"tp": 2, "ep": 2, "moe": True}, "not both"),
        ({"tp": 2, "rank": 2}, r"rank must be an int in 0\.\.1"),
        ({"tp": 2, "group_name": 0}, "group_name must be a str"),
        ({"microbatches": 0}, "microbatches must be >= 1"),
    ],
)
def test_bad_sharding_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        decoder_stack(**SMALL, **kwargs)


@pytest.fixture(scope="module")
def unscheduled_runs(msched_ranks: Callable[..., list[Any]]) -> list[dict[str, dict[str, Any]]]:
    return msched_ranks(run_unscheduled, timeout=240.0)


@pytest.mark.parametrize("case", list(CASES))
def test_on_two_ranks_each_rank_computes_the_unsharded_stack(
    unscheduled_runs: list[dict[str, dict[str, Any]]], case: str
) -> None:
    for found in (runs[case] for runs in unscheduled_runs):
        assert torch.allclose(found["out"], found["want_out"], atol=1e-5)
        assert torch.allclose(found["dest"], found["want_dest"], atol=1e-5)
        assert found["dest"].abs().sum() > 0  # every capture wrote
    if case.startswith("ep"):  # each rank routes tokens of its own
        assert not torch.equal(unscheduled_runs[0][case]["out"], unscheduled_runs[1][case]["out"])
