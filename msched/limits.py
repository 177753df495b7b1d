"""Bounds on msched's arguments and the one validator of counts that every entry point uses.

`MAX_STREAMS` (64) bounds the number of streams a schedule may use, and with it every stream
id a scheduled graph may name.  Why 64:

- hardware: a CUDA device runs at most 32 to 128 streams concurrently (its hardware work
  queues, ``CUDA_DEVICE_MAX_CONNECTIONS`` up to 32 on most parts); streams beyond that are
  multiplexed onto the same queues and add synchronisation without adding overlap;
- cost: the emitter and the verifier keep one vector clock of ``streams`` entries per stream
  and a clock snapshot per node, O(streams²) memory and O(streams) work per wait, so an
  unbounded count turns a typo (``10**6``) into an out-of-memory error instead of a message;
- use: no schedule occupies more streams than it has compute nodes, and the graphs msched is
  for (decoder layers) have a handful of independent branches per layer.

`positive_int` is the single check of "an int >= 1 (and at most ``maximum``)": bools and other
types are refused, as are floats with an integral value.  `check_flag` is the one check of a
flag argument (``verify``, ``piecewise``, ``exit_edges``): True or False only, so that
``verify="no"`` is an error, not a truthy string.  `check_num_streams` applies it to a
stream count with `MAX_STREAMS` as the bound; `msched.schedule`, `msched.verify`, the
backend, the CLI and the pytest plugin all call it, so they agree on what they accept.
"""

from __future__ import annotations

from msched.errors import InvalidArgumentError

MAX_STREAMS = 64


def positive_int(value: object, name: str, maximum: int | None = None, why: str = "") -> int:
    """Return ``value`` if it is an int in ``1..maximum``; raise `InvalidArgumentError` if not.

    ``name`` is the argument's name and ``why`` the reason for ``maximum``, both used in the
    messages.  ``bool`` is not accepted as an int.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        bound = f" and <= {maximum}" if maximum is not None else ""
        raise InvalidArgumentError(
            f"{name} must be an int >= 1{bound}, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    if maximum is not None and value > maximum:
        reason = f": {why}" if why else ""
        raise InvalidArgumentError(f"{name} must be <= {maximum}, got {value}{reason}")
    return value


def check_flag(value: object, name: str) -> bool:
    """Return ``value`` if it is a bool; raise `InvalidArgumentError` naming ``name`` and the
    value if not (``"no"``, ``0`` or ``None`` would otherwise count by their truth value)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__})"
        )
    return value


_WHY_MAX_STREAMS = (
    f"msched supports at most MAX_STREAMS = {MAX_STREAMS} streams (a GPU runs at most 32-128 "
    "streams concurrently, and the vector clocks grow with the square of the stream count)"
)


def check_num_streams(num_streams: object) -> int:
    """Return ``num_streams`` if it is an int in ``1..MAX_STREAMS``, else raise
    `InvalidArgumentError` saying the bound (see the module docstring for why there is one)."""
    return positive_int(num_streams, "num_streams", MAX_STREAMS, _WHY_MAX_STREAMS)
