"""`msched.read_schedule` (`msched.proof.scheduled`): a Schedule read back from a graph another
pass scheduled."""

from __future__ import annotations

import pytest
import torch
from torch.fx import Graph, GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.pictures.text import render_text

from .test_dialect import NAMESPACE, trtllm_schedule


def _retarget(gm: GraphModule, namespace: str) -> GraphModule:
    """A copy of msched-scheduled ``gm`` whose stream ops are ``namespace``'s."""
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in graph.nodes:
        if node.target in msched.ops.STREAM_OPS:
            name = node.target._schema.name.split("::")[1]
            node.target = getattr(getattr(torch.ops, namespace), name).default
    return GraphModule(gm, graph)


@pytest.mark.parametrize("streams", [2, 3])
def test_reading_msched_s_own_graph_gives_what_schedule_returned(streams: int) -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=True)
    sched = msched.schedule(stack.gm, streams)
    read = msched.read_schedule(sched.gm, original=sched.original)
    assert (read.num_streams, read.num_events, read.num_waits) == (
        sched.num_streams,
        sched.num_events,
        sched.num_waits,
    )
    assert read.makespan == sched.makespan and read.lower_bound == sched.lower_bound
    assert {n.name: s for n, s in read.streams.items()} == {
        n.name: s for n, s in sched.streams.items()
    }
    assert read.original is sched.original and read.assignment is None


def test_a_foreign_graph_reads_like_the_same_program_in_msched_s_ops() -> None:
    sched = msched.schedule(decoder_stack(4, (1, 3)).gm, 3)
    foreign = _retarget(sched.gm, NAMESPACE)
    read = msched.read_schedule(foreign, original=sched.original)
    assert read.dialect == msched.Dialect.from_namespace(NAMESPACE)
    assert (read.num_events, read.num_waits, read.makespan) == (
        sched.num_events,
        sched.num_waits,
        sched.makespan,
    )
    # The canonical text reads the same; only the op names of the stream ops differ (none are
    # printed: records and waits are shown as such).
    assert render_text(read) == render_text(msched.read_schedule(sched.gm, sched.original))
    assert msched.verify(foreign, original=sched.original).ok


def test_without_original_the_bound_comes_from_the_host_order_and_original_is_refused() -> None:
    read = msched.read_schedule(trtllm_schedule(wait_for_a=True))
    assert read.num_streams == 2 and read.num_waits == 2 and read.lower_bound > 0
    with pytest.raises(msched.InvalidArgumentError, match="pass original="):
        read.original  # noqa: B018


def test_bad_arguments() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="gm must be a torch.fx.GraphModule"):
        msched.read_schedule(Graph())  # type: ignore[arg-type]
    with pytest.raises(msched.InvalidArgumentError, match="unknown dialect"):
        msched.read_schedule(trtllm_schedule(True), dialect="no_such_dialect")
