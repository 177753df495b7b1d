"""`check_limit`: what ``assert_peak_memory(..., at_most=...)`` accepts."""

from __future__ import annotations

import pytest

import msched
from msched.testing.memory_checks import MAX_RATIO, check_limit


@pytest.mark.parametrize("at_most", [0, 3 * 2**30, 1.0, 1.25, MAX_RATIO])
def test_bytes_and_ratios_are_taken(at_most: float) -> None:
    assert check_limit(at_most) == at_most


def test_bytes_computed_as_a_float_are_refused_not_read_as_a_ratio() -> None:
    # 0.9 * 8 GiB is a float: read as a ratio it would never fail.
    with pytest.raises(msched.InvalidArgumentError, match=r"for bytes pass an int"):
        check_limit(0.9 * 8 * 2**30)
