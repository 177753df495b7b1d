"""Parametrization of tests over stream counts (the ``multistream`` marker and ``num_streams``).

A test is parametrized over stream counts, with ids ``streams2``, ``streams3``, ..., when it
is marked ``@pytest.mark.multistream`` (whether or not it requests ``num_streams``) or when it
requests ``num_streams`` directly or through another fixture (such as ``schedule_graph``).
The counts are the marker's ``streams=[...]``, else ``default`` (`Settings.streams`: command
line, ini, default).  The order is the order given, so every xdist worker collects the same
items.
"""

from __future__ import annotations

import pytest

from pytest_msched._options import MARKER, parse_streams

FIXTURE = "num_streams"


def stream_ids(counts: tuple[int, ...]) -> list[str]:
    """The test ids of ``counts``: ``(2, 3)`` → ``["streams2", "streams3"]``."""
    return [f"streams{n}" for n in counts]


def marker_streams(mark: pytest.Mark, where: str) -> tuple[int, ...] | None:
    """The counts of a ``multistream`` mark, ``None`` when it gives none.

    Raises `ValueError` with a usage message for positional or unknown arguments and for
    counts that are not a list of distinct ints >= 1.
    """
    usage = "use @pytest.mark.multistream or @pytest.mark.multistream(streams=[2, 3])"
    if mark.args:
        raise ValueError(f"{where}: multistream takes no positional arguments; {usage}")
    unknown = sorted(set(mark.kwargs) - {"streams"})
    if unknown:
        raise ValueError(f"{where}: multistream got unexpected arguments {unknown}; {usage}")
    if "streams" not in mark.kwargs:
        return None
    value = mark.kwargs["streams"]
    try:
        return parse_streams(value)
    except ValueError as error:
        raise ValueError(f"{where}: multistream(streams={value!r}): {error}") from None


def _user_parametrizes(metafunc: pytest.Metafunc) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if FIXTURE in names:
            return True
    return False


def counts_for(metafunc: pytest.Metafunc, default: tuple[int, ...]) -> tuple[int, ...] | None:
    """The stream counts ``metafunc``'s test runs with, ``None`` to leave it alone.

    Marked tests always get counts (a conflicting ``parametrize`` of ``num_streams`` is a
    usage error); unmarked tests get ``default`` when they request ``num_streams`` and
    do not parametrize it themselves.
    """
    mark = metafunc.definition.get_closest_marker(MARKER)
    if mark is None:
        wanted = FIXTURE in metafunc.fixturenames and not _user_parametrizes(metafunc)
        return default if wanted else None
    where = f"In {metafunc.definition.nodeid}"
    if _user_parametrizes(metafunc):
        raise ValueError(
            f"{where}: num_streams is parametrized both by multistream and by "
            "@pytest.mark.parametrize; keep one"
        )
    return marker_streams(mark, where) or default


def parametrize(metafunc: pytest.Metafunc, default: tuple[int, ...]) -> None:
    """Parametrize ``num_streams`` (indirectly, through its fixture) for one test function.

    Bad marker arguments fail collection of the test's module with a usage message.
    """
    try:
        counts = counts_for(metafunc, default)
    except ValueError as error:
        raise pytest.fail.Exception(str(error), pytrace=False) from None
    if counts is None:
        return
    if FIXTURE not in metafunc.fixturenames:
        # A marked test that does not ask for num_streams is parametrized all the same.
        metafunc.fixturenames.append(FIXTURE)
    metafunc.parametrize(FIXTURE, counts, ids=stream_ids(counts), indirect=True)


def requested_count(request: pytest.FixtureRequest) -> int:
    """The count the ``num_streams`` fixture returns for the running test.

    Fails the test with a usage message when ``num_streams`` was not parametrized at
    collection (it was requested with ``request.getfixturevalue``).
    """
    count = getattr(request, "param", None)
    if not isinstance(count, int):
        pytest.fail(
            f"{request.node.nodeid}: num_streams is chosen at collection; request it as an "
            "argument of the test or of a fixture (or mark the test with "
            "@pytest.mark.multistream), not through request.getfixturevalue",
            pytrace=False,
        )
    return count
