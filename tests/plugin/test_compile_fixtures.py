"""The ``traced_decoder`` fixture: TinyDecoder compiled with msched.backend per stream count.

``-p pytest_msched.compile_fixtures`` loads the fixture module explicitly, so this test holds
whether or not the plugin lists it yet.
"""

from __future__ import annotations

import pytest

TRACED_TEST = """
import pytest
import msched

@pytest.mark.multistream(streams=[1, 3])
def test_traced(traced_decoder, num_streams):
    t = traced_decoder(n_layers=2, capture_layers=(0, 1), hidden=8, tokens=4)
    assert t.num_streams == num_streams and t.piecewise
    assert len(t.pieces) == 5
    for piece in t.pieces:
        assert piece.schedule.num_streams == num_streams
        assert msched.verify(piece.gm, original=piece.schedule.original).ok
        assert piece.name in t.piece_inputs
    assert (t.output == t.reference_output).all()
    assert (t.capture == t.reference_capture).all()
    assert t.piece_capturing(1) is t.pieces[-1]
    assert traced_decoder(n_layers=2, capture_layers=[0, 1], hidden=8, tokens=4) is t  # cached
"""


def test_traced_decoder_compiles_per_stream_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TRACED_TEST)
    result = pytester.runpytest("-p", "pytest_msched.compile_fixtures", "-v")
    result.stdout.fnmatch_lines(
        ["*::test_traced[[]streams1[]] PASSED*", "*::test_traced[[]streams3[]] PASSED*"]
    )
    result.assert_outcomes(passed=2)
