"""The ``trace_streams`` fixture: a model's own stream code, traced on CPU for verification.

``trace_streams(fn, *example_inputs, caller_stream=None, stage="dynamo")`` is
`msched.trace_streams`: the ``GraphModule`` PyTorch builds for ``fn``'s stream code (never
run; ``stage="inductor"``: Inductor's final kernel order), ready for ``msched.verify(gm)``
or the assertion helpers; each graph is counted in the terminal summary (``graphs traced
(trace_streams): ...``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msched._session import GraphRecord, MschedSession

if TYPE_CHECKING:
    from torch.fx import GraphModule


@pytest.fixture
def trace_streams(request: pytest.FixtureRequest) -> Callable[..., GraphModule]:
    """`msched.trace_streams`, with every graph it returns counted in the summary.

    A function that cannot be traced in one graph fails the test with msched's reason (for
    example ``torch.cuda`` names on a CPU-only machine outside
    ``msched.cuda_streams_on_cpu()``).
    """
    import msched
    from msched.proof.interpreter import interpret

    session = MschedSession.of(request.config)

    def trace(fn: Callable[..., Any], *example_inputs: Any, **options: Any) -> GraphModule:
        __tracebackhide__ = True
        try:
            gm = msched.trace_streams(fn, *example_inputs, **options)
        except msched.InvalidArgumentError as error:
            pytest.fail(f"trace_streams: {error}", pytrace=False)
        program = interpret(gm)
        session.stats.add(
            GraphRecord(
                program.num_streams, program.num_events, program.num_waits, None, traced=True
            )
        )
        return gm

    return trace
