"""The ``multistream`` marker and ``num_streams``: loading, ids, precedence, usage errors.

Every run here happens in a fresh ``pytester`` directory without a conftest, so the plugin
can only come from its ``pytest11`` entry point.  These runs collect or run trivial tests
(no graph is built), so they run in-process except the one that proves the entry point.
"""

from __future__ import annotations

import pytest

IDS_TEST = """
import pytest

@pytest.mark.multistream{args}
def test_it(request, num_streams):
    assert request.node.callspec.id == f"streams{{num_streams}}"
"""


def test_entry_point_registers_plugin_and_marker(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers", "--trace-config")
    result.stdout.fnmatch_lines(["PLUGIN registered: <module 'pytest_msched.plugin' from *"])
    result.stdout.fnmatch_lines(["@pytest.mark.multistream(streams=[[]2, 3[]]): *num_streams*"])
    assert result.ret == pytest.ExitCode.OK


def test_marked_test_runs_once_per_default_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(IDS_TEST.format(args=""))
    result = pytester.runpytest("-v", "--strict-markers")
    result.stdout.fnmatch_lines(
        ["*::test_it[[]streams2[]] PASSED*", "*::test_it[[]streams3[]] PASSED*"]
    )
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("marker", "cli", "ini", "expected"),
    [
        pytest.param("", [], "4, 5", ["streams4", "streams5"], id="ini-over-default"),
        pytest.param("", ["--msched-streams=3"], "4,5", ["streams3"], id="cli-over-ini"),
        pytest.param(
            "(streams=[6, 2])",
            ["--msched-streams=3"],
            "4,5",
            ["streams6", "streams2"],
            id="marker-over-cli-and-ini",
        ),
    ],
)
def test_stream_count_precedence(
    pytester: pytest.Pytester, marker: str, cli: list[str], ini: str, expected: list[str]
) -> None:
    pytester.makeini(f"[pytest]\nmsched_streams = {ini}\n")
    pytester.makepyfile(IDS_TEST.format(args=marker))
    result = pytester.runpytest("-v", *cli)
    result.stdout.fnmatch_lines([f"*::test_it[[]{i}[]] PASSED*" for i in expected])
    result.assert_outcomes(passed=len(expected))


def test_who_gets_parametrized(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.multistream(streams=[4])
        def test_marked_without_fixture():
            pass

        def test_unmarked_requesting(num_streams):
            pass

        def test_unmarked_through_fixture(schedule_graph):
            pass

        @pytest.mark.parametrize("num_streams", [7])
        def test_unmarked_own_parametrize(num_streams):
            assert num_streams == 7

        def test_plain():
            pass

        @pytest.mark.multistream(streams=[5])
        class TestClass:
            def test_method(self, num_streams):
                assert num_streams == 5
        """
    )
    result = pytester.runpytest("--collect-only", "-q", "--msched-streams=2,3")
    assert result.stdout.lines[:9] == [
        "test_who_gets_parametrized.py::test_marked_without_fixture[streams4]",
        "test_who_gets_parametrized.py::test_unmarked_requesting[streams2]",
        "test_who_gets_parametrized.py::test_unmarked_requesting[streams3]",
        "test_who_gets_parametrized.py::test_unmarked_through_fixture[streams2]",
        "test_who_gets_parametrized.py::test_unmarked_through_fixture[streams3]",
        "test_who_gets_parametrized.py::test_unmarked_own_parametrize[7]",
        "test_who_gets_parametrized.py::test_plain",
        "test_who_gets_parametrized.py::TestClass::test_method[streams5]",
        "",
    ]


BAD_MARKERS = {
    "test_zero": ("(streams=[0])", "multistream(streams=[[]0[]]): expected a list of distinct *"),
    "test_text": ("(streams='x')", "multistream(streams='x'): expected a list of distinct *"),
    "test_repeat": ("(streams=[2, 2])", "multistream(streams=[[]2, 2[]]): *(a count is repeated)"),
    "test_positional": ("(3)", "multistream takes no positional arguments; use *"),
    "test_unknown": ("(stream=[3])", "multistream got unexpected arguments [[]'stream'[]]; use *"),
}


def test_bad_marker_arguments_are_usage_errors_at_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**{name: IDS_TEST.format(args=m) for name, (m, _) in BAD_MARKERS.items()})
    result = pytester.runpytest("--collect-only")
    for name, (_, message) in BAD_MARKERS.items():
        result.stdout.fnmatch_lines(
            [f"*ERROR collecting {name}.py*", f"In {name}.py::test_it: {message}"]
        )
    result.stdout.fnmatch_lines(["*Interrupted: 5 errors during collection*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_marker_and_parametrize_of_num_streams_conflict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.multistream
        @pytest.mark.parametrize("num_streams", [4])
        def test_it(num_streams):
            pass
        """
    )
    result = pytester.runpytest("--collect-only")
    result.stdout.fnmatch_lines(["*num_streams is parametrized both by multistream and by*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


@pytest.mark.parametrize(
    ("ini", "cli", "message"),
    [
        (None, "--msched-streams=2,x", "*argument --msched-streams: expected stream counts*"),
        (None, "--msched-streams=0", "*argument --msched-streams: expected a list of distinct*"),
        (
            "msched_streams = 2,0",
            None,
            "ERROR: ini option msched_streams: expected a list of distinct*'2,0'",
        ),
        (None, "--msched-verify=loose", "*argument --msched-verify: invalid choice: 'loose'*"),
        (
            "msched_verify = loose",
            None,
            "ERROR: ini option msched_verify: expected one of strict, off; got 'loose'",
        ),
    ],
)
def test_bad_option_values_are_usage_errors(
    pytester: pytest.Pytester, ini: str | None, cli: str | None, message: str
) -> None:
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(IDS_TEST.format(args=""))
    result = pytester.runpytest(*([cli] if cli else []))
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_num_streams_through_getfixturevalue_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_it(request):
            request.getfixturevalue("num_streams")
        """
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*num_streams is chosen at collection; request it as an*"])
    result.assert_outcomes(failed=1)
