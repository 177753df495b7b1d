"""The toy engine's multi-stream pass, tested with pytest-msched.

Every test runs once per stream count (``[streams2]``, ``[streams3]``).  ``schedule_graph``
runs the configured scheduler (``toyengine.multistream.schedule``, see ``conftest.py``) and
verifies the result against the unscheduled graph; the helpers check the two things that
went wrong in production; the snapshot keeps the reviewed schedule.
"""

import pytest
import torch
import toyengine  # noqa: F401  (registers torch.ops.toyeng)

from pytest_msched import (
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)

CAPTURE = torch.ops.toyeng.inplace_slice_copy.default

pytestmark = pytest.mark.multistream(streams=[2, 3])


def check_captures(stack, sched, dialect):
    """Every capture runs before ``output``, is joined by the exit and writes its slice."""
    assert_captures_precede_output(sched.gm, stack.captures, dialect=dialect)
    for capture in stack.captures:
        assert_exit_waits_on(sched.gm, capture, dialect=dialect)
    assert_race_free(sched.gm, sched.original, dialect=dialect)
    x, dest = stack.example_inputs()
    assert_survives_recompile(sched.gm, stack.captures, inputs=(x, dest), dialect=dialect)
    assert torch.equal(dest, stack.reference()[1])


def test_eagle3_decoder(decoder_stack, schedule_graph, msched_dialect, graph_snapshot):
    # Captures of layers 1, 3 and 5: the last layer's is the one a scheduler used to drop.
    stack = decoder_stack(n_layers=6, capture_layers=(1, 3, 5), capture_op=CAPTURE)
    sched = schedule_graph(stack.gm)
    check_captures(stack, sched, msched_dialect)
    assert sched == graph_snapshot


def test_moe_decoder(decoder_stack, schedule_graph, msched_dialect, graph_snapshot):
    # Routed experts and the shared expert are independent: the pass runs them in parallel.
    stack = decoder_stack(n_layers=2, capture_layers=(1,), moe=True, capture_op=CAPTURE)
    sched = schedule_graph(stack.gm)
    check_captures(stack, sched, msched_dialect)
    x, dest = stack.example_inputs()
    out = sched.gm(x, dest)
    assert torch.allclose(out, stack.reference()[0])
    assert sched == graph_snapshot
