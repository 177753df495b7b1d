"""`msched.limits`: one bound on stream counts and one positive-int check, used everywhere."""

from __future__ import annotations

import pytest

import msched
from msched.limits import MAX_STREAMS, check_num_streams, positive_int
from msched.models.decoders import decoder_stack
from pytest_msched._options import parse_streams


def test_the_bound_is_public_and_documented() -> None:
    assert msched.MAX_STREAMS == MAX_STREAMS == 64
    assert "MAX_STREAMS" in msched.__all__
    assert "O(streams²)" in (msched.limits.__doc__ or "")


@pytest.mark.parametrize("good", [1, 2, MAX_STREAMS])
def test_stream_counts_in_range_pass_unchanged(good: int) -> None:
    assert check_num_streams(good) == good


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (0, "num_streams must be >= 1, got 0"),
        (-3, "num_streams must be >= 1, got -3"),
        (True, "num_streams must be an int >= 1 and <= 64, got True (bool)"),
        (2.0, "num_streams must be an int >= 1 and <= 64, got 2.0 (float)"),
        ("2", "num_streams must be an int >= 1 and <= 64, got '2' (str)"),
        (None, "num_streams must be an int >= 1 and <= 64, got None (NoneType)"),
        (
            65,
            "num_streams must be <= 64, got 65: msched supports at most MAX_STREAMS = 64 "
            "streams (a GPU runs at most 32-128 streams concurrently, and the vector clocks "
            "grow with the square of the stream count)",
        ),
    ],
)
def test_bad_stream_counts_say_what_is_expected(bad: object, message: str) -> None:
    with pytest.raises(msched.InvalidArgumentError) as info:
        check_num_streams(bad)
    assert str(info.value) == message


def test_positive_int_without_a_bound() -> None:
    assert positive_int(10**9, "layers") == 10**9
    with pytest.raises(msched.InvalidArgumentError, match="layers must be >= 1, got 0"):
        positive_int(0, "layers")


@pytest.mark.parametrize("bad", [0, True, 1.5, MAX_STREAMS + 1])
def test_every_entry_point_refuses_the_same_stream_counts(bad: object) -> None:
    stack = decoder_stack(1, (0,))
    with pytest.raises(msched.InvalidArgumentError, match="num_streams must be"):
        msched.schedule(stack.gm, bad)  # type: ignore[arg-type]
    with pytest.raises(msched.InvalidArgumentError, match="num_streams must be"):
        msched.verify(stack.gm, num_streams=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"expected a list of distinct stream counts.*{bad}"):
        parse_streams([2, bad])


@pytest.mark.parametrize(("name", "value"), [("n_layers", 0), ("hidden", True), ("tokens", 1.0)])
def test_decoder_stack_sizes_use_the_same_check(name: str, value: object) -> None:
    sizes: dict[str, object] = {"n_layers": 1, "hidden": 8, "tokens": 4, name: value}
    with pytest.raises(msched.InvalidArgumentError, match=f"{name} must be"):
        decoder_stack(sizes.pop("n_layers"), (), **sizes)  # type: ignore[arg-type]
