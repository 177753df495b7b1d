"""Both compilers on the tensor-parallel stack on two gloo ranks: a `TensorParallelDecoder`
(functional all-reduces after ``wo`` and ``wd``) compiled with ``msched.backend(num_streams=2,
compiler=...)`` equals eager on every rank, and eager equals the unsharded `TinyDecoder`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.msched.compile.sharded_compile import (
    compiled_tensor_parallel,
    inductor_collective_block,
    traced_bucketed_all_reduces,
    traced_kernel_order_swapped,
    warnings_of_a_broken_graph,
)


@pytest.mark.parametrize("compiler", ["fx", pytest.param("inductor", marks=pytest.mark.slow)])
def test_both_compilers_run_the_tensor_parallel_stack_like_eager_on_every_rank(
    compiler: str, tmp_path, msched_ranks: Callable[..., list[Any]]
) -> None:
    ranks = msched_ranks(compiled_tensor_parallel, compiler, str(tmp_path), timeout=500.0)
    for found in ranks:
        assert torch.allclose(found["got"], found["want"], atol=1e-5)
        assert torch.allclose(found["got_capture"], found["want_capture"], atol=1e-5)
        assert torch.allclose(found["want"], found["full"], atol=1e-5)
        assert torch.allclose(found["want_capture"], found["full_capture"], atol=1e-5)
        assert found["collectives"].count("_c10d_functional.all_reduce") == 4
        assert found["collectives"].count("_c10d_functional.wait_tensor") == 4
        assert found["verified"] and all(found["verified"])
    if compiler == "inductor":  # the kernel order issues the all-reduces as the program did
        first, second = (found["kernel_collectives"] for found in ranks)
        assert first == second
        issued = [c for piece in first for c in piece]
        assert [op for op, _, _ in issued] == ["all_reduce_"] * 4
        assert [i for _, _, i in issued] == sorted(i for _, _, i in issued)


@pytest.mark.slow
def test_a_hand_edited_kernel_order_with_two_all_reduces_swapped_fails_at_stage_inductor(
    tmp_path, msched_ranks: Callable[..., list[Any]]
) -> None:
    ranks = msched_ranks(traced_kernel_order_swapped, str(tmp_path), timeout=300.0)
    for found in ranks:
        assert found["ok"].startswith("schedule verified"), found["ok"]
        assert found["issued"] == [("all_reduce_", "0", 0), ("all_reduce_", "0", 1)]
        assert found["ops"].count("_c10d_functional.wait_tensor.default") == 2
        assert found["swapped"] == ["collective-order"]
        assert found["edited"] == ["collective-order"]


@pytest.mark.slow
def test_all_reduces_inductor_buckets_into_one_kernel_are_issued_as_one_collective(
    tmp_path, msched_ranks: Callable[..., list[Any]]
) -> None:
    """Inductor's FX bucketing (a post-grad pass) merges the two all-reduces into one before
    msched stamps issue positions (after every post-grad pass), so the merged collective is
    a collective of the program handed to Inductor, with position 0, and its kernel carries
    it; the members' positions (Dynamo's graph) are gone with their nodes, and every rank
    buckets alike, so the order checked is the bucketed program's."""
    ranks = msched_ranks(traced_bucketed_all_reduces, str(tmp_path), timeout=300.0)
    for found in ranks:
        assert found["ok"].startswith("schedule verified"), found["ok"]
        assert found["issued"] == [("all_reduce_", "0", 0)]
        assert found["origins"] == [("all_reduce_2",)]


@pytest.mark.slow
@pytest.mark.parametrize("num_streams", [2, 3])
def test_inductor_builds_a_verified_block_of_every_collective_on_every_rank(
    num_streams: int, tmp_path, msched_ranks: Callable[..., list[Any]]
) -> None:
    """Inductor orders each collective's issue after the one before (``WeakDep(is_fake=True)``
    from the stream-1 ``all_gather`` to the stream-0 ``all_reduce`` and its wait): an ordering
    dependency, not a read; read as one, verify reported a race on the all-reduced buffer and
    the correct block failed to build (PieceVerificationError)."""
    ranks = msched_ranks(inductor_collective_block, num_streams, str(tmp_path), timeout=500.0)
    for found in ranks:
        assert found["verified"] and all(found["verified"]), found["reports"]
        assert max(found["streams"]) > 1
        assert torch.allclose(found["got"], found["want"], atol=1e-5)


@pytest.mark.parametrize("compiler", ["fx", pytest.param("inductor", marks=pytest.mark.slow)])
def test_an_async_all_reduce_outside_the_graphs_warns_once_and_split_ops_once_per_graph(
    compiler: str, msched_ranks: Callable[..., list[Any]]
) -> None:
    """``dist.all_reduce(y, async_op=True)`` and ``work.wait()`` break Dynamo's graph: the
    all-reduce runs eagerly, unscheduled; one warning per compile says so.  The two
    attention-free graphs it leaves are compiled twice each (static, then dynamic sizes):
    one split-op warning per graph, not per compile of it."""
    ranks = msched_ranks(warnings_of_a_broken_graph, compiler, timeout=300.0)
    for found in ranks:
        assert found["equal"]
        assert len(found["outside"]) == 1, found["outside"]
        assert "torch.distributed.all_reduce(..., async_op=True)" in found["outside"][0]
        assert found["graphs"] > 2  # Dynamo did compile the graphs again
        assert len(found["split"]) == 2, found["split"]
