"""The fixtures of pytest-msched; each wraps a plain msched function.

- ``num_streams``: the stream count of the running test (parametrized at collection, see
  `pytest_msched._params`);
- ``decoder_stack``: the factory `msched.decoder.decoder_stack`;
- ``schedule_graph``: `msched.testing.checks.schedule_and_verify` with ``num_streams``:
  `msched.schedule`, then `msched.verify` against the original graph (unless verification is
  off), counted and kept for dumps by the `MschedSession`;
- ``graph_snapshot``: syrupy's ``snapshot`` with `ScheduledGraphExtension`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from syrupy.assertion import SnapshotAssertion
from torch.fx import GraphModule

import msched
from msched.analysis.cost import CostModel
from msched.testing.decoders import DecoderStack
from msched.testing.decoders import decoder_stack as build_decoder_stack
from pytest_msched._params import requested_count
from pytest_msched._session import MschedSession
from pytest_msched.snapshot import ScheduledGraphExtension


@pytest.fixture
def num_streams(request: pytest.FixtureRequest) -> int:
    """The stream count of this test item (``2`` in ``test[streams2]``)."""
    return requested_count(request)


@pytest.fixture
def decoder_stack() -> Callable[..., DecoderStack]:
    """A factory of synthetic Eagle3 decoder stacks: `msched.decoder.decoder_stack`.

    ``decoder_stack(n_layers=6, capture_layers=(1, 3, 5), moe=False, hidden=8, tokens=4,
    seed=0)`` returns a `msched.decoder.DecoderStack` with a new ``.gm`` on every call.
    """
    return build_decoder_stack


@pytest.fixture
def schedule_graph(
    request: pytest.FixtureRequest, num_streams: int
) -> Callable[..., msched.Schedule]:
    """``schedule_graph(gm, cost_model=None) -> Schedule`` on ``num_streams`` streams.

    Rewrites ``gm`` in place (as `msched.schedule` does), verifies the result against
    ``Schedule.original`` and fails the test with the report and the lines around each
    violation when verification finds any (``--msched-verify=off`` or ``msched_verify = off``
    skips verification).
    The graph is counted in the terminal summary and dumped by ``--msched-dump`` if the
    test fails.
    """
    session = MschedSession.of(request.config)
    nodeid = request.node.nodeid

    def schedule_graph(gm: GraphModule, cost_model: CostModel | None = None) -> msched.Schedule:
        check = session.schedule_graph(nodeid, gm, num_streams, cost_model)
        if check.failure:
            pytest.fail(check.failure, pytrace=False)
        return check.schedule

    return schedule_graph


@pytest.fixture
def graph_snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """syrupy's ``snapshot`` storing scheduled graphs as ``.msched.txt`` text files.

    ``assert sched == graph_snapshot`` (or ``assert gm == graph_snapshot``).
    """
    return snapshot.use_extension(ScheduledGraphExtension)
