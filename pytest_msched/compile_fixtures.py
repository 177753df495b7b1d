"""Fixtures around ``torch.compile`` with `msched.backend`; each wraps a plain msched function.

- ``traced_decoder``: a factory of `msched.testing.traced.TracedDecoder` — a `TinyDecoder` compiled
  with ``msched.backend(num_streams, piecewise, ...)`` for the test's ``num_streams``, its
  scheduled pieces, what each piece was called with, and the eager reference results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msched._session import MschedSession

if TYPE_CHECKING:
    from msched.testing.traced import TracedDecoder


@pytest.fixture
def traced_decoder(
    request: pytest.FixtureRequest, num_streams: int
) -> Callable[..., TracedDecoder]:
    """``traced_decoder(piecewise=True, moe=False, n_layers=12, capture_layers=(1, 5, 11),
    hidden=16, tokens=8, seed=0, **backend_kwargs) -> TracedDecoder`` on ``num_streams``.

    ``.pieces`` are the scheduled pieces (``piece.gm``, ``piece.schedule.original``),
    ``.piece_inputs[piece.name]`` their inputs, ``.output`` / ``.capture`` the compiled run
    and ``.reference_output`` / ``.reference_capture`` the eager one.  Results are shared by
    every test of the session that asks for the same arguments (`MschedSession` keeps them):
    treat them as read-only.
    Compiling resets dynamo (`msched.compile.compiler.compile_and_run`).
    """
    session = MschedSession.of(request.config)

    def factory(**kwargs: Any) -> TracedDecoder:
        return session.traced_decoder(num_streams, kwargs)

    return factory
