"""Testing a downstream scheduler: the fixtures ``msched_scheduler`` and ``msched_dialect``,
their ini and command-line options, usage errors, and ``schedule_graph`` running a foreign
pass (read back, verified, counted, dumped; failures name the scheduler).

The inner runs are in-process ``pytester`` runs.  Their scheduler is `tests.plugin.foreign`
(importable because this suite's rootdir is on ``sys.path``), whose op namespace is
registered once per process (this module imports it first); the test of a namespace that
only exists once the scheduler's module is imported writes a module of its own.
"""

from __future__ import annotations

import re

import pytest

# Imported here, before any inner run: pytester forgets the modules an inner run imported, and
# importing `foreign` twice would register its op namespace twice.
from tests.plugin import foreign  # noqa: F401

FIXTURES_TEST = """
import pytest


@pytest.mark.multistream(streams=[2])
def test_fixtures(msched_scheduler, msched_dialect):
    name = getattr(msched_scheduler, "__qualname__", repr(msched_scheduler))
    print(f"SCHEDULER {msched_scheduler.__module__}.{name}")
    print(f"DIALECT {msched_dialect and msched_dialect.own_namespace()}")
"""

SCHEDULE_TEST = """
import pytest
import torch

from pytest_msched import assert_exit_waits_on
from tests.plugin import foreign


@pytest.mark.multistream(streams=[2])
def test_schedule(decoder_stack, schedule_graph, msched_dialect, num_streams):
    stack = decoder_stack(n_layers=2, capture_layers=(0, 1), capture_op=foreign.CAPTURE)
    sched = schedule_graph(stack.gm)
    waits = [n for n in sched.gm.graph.nodes if n.target is foreign.WAIT]
    assert waits, "the foreign pass did not run"
    assert sched.num_streams == num_streams
    assert not [n for n in sched.original.graph.nodes if n.target is foreign.WAIT]
    assert_exit_waits_on(sched.gm, "capture_1", dialect=msched_dialect)
"""


def _fixture_values(result: pytest.RunResult) -> tuple[str, str]:
    found = re.search(r"SCHEDULER (\S+)\nDIALECT (\S+)", result.stdout.str())
    assert found, result.stdout.str()
    return found.group(1), found.group(2)


@pytest.mark.parametrize(
    ("ini", "cli", "scheduler", "dialect"),
    [
        pytest.param("", [], "msched.scheduling.pipeline.schedule", "None", id="defaults"),
        pytest.param(
            "msched_scheduler = tests.plugin.foreign:schedule_copy\n"
            "msched_dialect = msched_plugin_eng",
            [],
            "tests.plugin.foreign.schedule_copy",
            "msched_plugin_eng",
            id="ini",
        ),
        pytest.param(
            "msched_scheduler = tests.plugin.foreign:schedule_copy\nmsched_dialect = trtllm",
            [
                "--msched-scheduler=tests.plugin.foreign:schedule_in_place",
                "--msched-dialect=msched",
            ],
            "tests.plugin.foreign.schedule_in_place",
            "msched",
            id="cli-wins",
        ),
        pytest.param(
            "msched_dialect = tests.plugin.foreign:DIALECT",
            [],
            "msched.scheduling.pipeline.schedule",
            "msched_plugin_eng",
            id="dialect-attribute",
        ),
    ],
)
def test_scheduler_and_dialect_options(
    pytester: pytest.Pytester, ini: str, cli: list[str], scheduler: str, dialect: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_fixtures=FIXTURES_TEST)
    result = pytester.runpytest("-s", *cli)
    result.assert_outcomes(passed=1)
    assert _fixture_values(result) == (scheduler, dialect)


def test_the_dialect_help_names_every_built_in_dialect(pytester: pytest.Pytester) -> None:
    from msched.proof.dialects import builtin_dialects
    from pytest_msched._options import BUILT_IN_DIALECTS

    assert BUILT_IN_DIALECTS == tuple(builtin_dialects())
    help_text = " ".join(pytester.runpytest("--help").stdout.str().split())
    names = ", ".join(BUILT_IN_DIALECTS)
    option = "--msched-dialect=NAME the stream ops of the scheduled graphs: a built-in dialect"
    assert f"{option} ({names})," in help_text
    assert (
        f"msched_dialect (string): the dialect of the scheduled graphs: {names}, an op" in help_text
    )


def test_ini_configured_scheduler_runs_in_schedule_graph(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nmsched_scheduler = tests.plugin.foreign:schedule_in_place\n"
        "msched_dialect = msched_plugin_eng\n"
    )
    pytester.makepyfile(test_schedule=SCHEDULE_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["graphs scheduled: 1 (streams2: 1)", "violations: 0"])


def test_dialect_namespace_registered_by_the_scheduler_module(pytester: pytest.Pytester) -> None:
    """The namespace exists only once the scheduler's module is imported: it is imported
    first, then the dialect is looked up."""
    pytester.makepyfile(
        lazyengine="""
        import torch
        from torch.fx.node import has_side_effect

        from tests.plugin import foreign

        _lib = torch.library.Library("msched_plugin_lazy", "DEF")
        for schema in ("set_stream(int stream) -> ()", "record_event(int event) -> ()",
                       "wait_event(int event) -> ()",
                       "record_stream(Tensor t, int stream) -> ()"):
            _lib.define(schema)
            _lib.impl(schema.split("(")[0], lambda *args: None, "CompositeExplicitAutograd")
        LAZY = {
            msched_op: getattr(torch.ops.msched_plugin_lazy, msched_op._opname).default
            for msched_op in foreign.STREAM_OPS
        }
        for op in LAZY.values():
            has_side_effect(op)


        def schedule(gm, num_streams):
            foreign.schedule_in_place(gm, num_streams)
            for node in gm.graph.nodes:
                for msched_op, foreign_op in foreign.STREAM_OPS.items():
                    if node.target is foreign_op:
                        node.target = LAZY[msched_op]
            gm.recompile()
        """
    )
    pytester.makeini(
        "[pytest]\npythonpath = .\nmsched_scheduler = lazyengine:schedule\n"
        "msched_dialect = msched_plugin_lazy\n"
    )
    pytester.makepyfile(
        test_lazy="""
        import pytest
        import torch

        from pytest_msched import assert_exit_waits_on


        @pytest.mark.multistream(streams=[2])
        def test_lazy(decoder_stack, schedule_graph, msched_dialect):
            assert msched_dialect.own_namespace() == "msched_plugin_lazy"
            stack = decoder_stack(n_layers=2, capture_layers=(0, 1))
            sched = schedule_graph(stack.gm)
            targets = {str(n.target) for n in sched.gm.graph.nodes}
            assert "msched_plugin_lazy.wait_event.default" in targets
            assert_exit_waits_on(sched.gm, "capture_1", dialect=msched_dialect)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


MISSING = "msched_plugin_missing_module"


@pytest.mark.parametrize(
    ("where", "option", "value", "error"),
    [
        ("ini", "msched_scheduler", f"{MISSING}:schedule", f"cannot import {MISSING} (*)"),
        ("cli", "msched_scheduler", f"{MISSING}:schedule", f"cannot import {MISSING} (*)"),
        (
            "cli",
            "msched_scheduler",
            "tests.plugin.foreign:no_such_pass",
            "tests.plugin.foreign has no attribute 'no_such_pass'",
        ),
        (
            "ini",
            "msched_scheduler",
            "tests.plugin.foreign:NAMESPACE",
            "tests.plugin.foreign:NAMESPACE is a str, not a callable scheduler(gm, num_streams)",
        ),
        (
            "ini",
            "msched_scheduler",
            "tests.plugin.foreign.schedule_copy",
            "expected package.module:function",
        ),
        (
            "ini",
            "msched_dialect",
            "no_such_dialect",
            "unknown dialect 'no_such_dialect'; give a dialect name (*",
        ),
        (
            "cli",
            "msched_dialect",
            "msched_",
            "unknown dialect 'msched_' (did you mean 'msched'?); give *",
        ),
        (
            "cli",
            "msched_dialect",
            "tests.plugin.foreign:schedule_copy",
            "tests.plugin.foreign:schedule_copy is a function, not a msched.Dialect; give *",
        ),
        ("ini", "msched_dialect", f"{MISSING}:DIALECT", f"cannot import {MISSING} (*); give *"),
    ],
)
def test_bad_configuration_is_a_usage_error_naming_option_and_value(
    pytester: pytest.Pytester, where: str, option: str, value: str, error: str
) -> None:
    pytester.makepyfile(test_fixtures=FIXTURES_TEST)
    if where == "ini":
        pytester.makeini(f"[pytest]\n{option} = {value}\n")
        result = pytester.runpytest()
        expected = f"ERROR: ini option {option}: {error}; got '{value}'"
    else:
        flag = "--" + option.replace("_", "-")
        result = pytester.runpytest(f"{flag}={value}")
        expected = f"ERROR: {flag}: {error}; got '{value}'"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected.replace("[", "[[]")])


CONFTEST = """
import functools

import pytest

import msched
from tests.plugin import foreign

calls = []


{scheduler}


@pytest.fixture
def msched_dialect():
    return {dialect}
"""


def _conftest(pytester: pytest.Pytester, scheduler: str, dialect: str = "None") -> None:
    pytester.makeconftest(CONFTEST.format(scheduler=scheduler, dialect=dialect))


def _returning(expression: str) -> str:
    return f"@pytest.fixture\ndef msched_scheduler():\n    return {expression}"


def test_conftest_overrides_schedule_the_graph_with_the_given_count(
    pytester: pytest.Pytester,
) -> None:
    _conftest(
        pytester,
        "def recording(gm, num_streams):\n"
        "    calls.append(num_streams)\n"
        "    return foreign.schedule_copy(gm, num_streams)\n\n\n" + _returning("recording"),
        dialect="foreign.DIALECT",
    )
    pytester.makepyfile(
        test_schedule=SCHEDULE_TEST.replace("streams=[2]", "streams=[2, 3]")
        + "\n\ndef test_calls():\n    import conftest\n    assert conftest.calls == [2, 3]\n"
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["graphs scheduled: 2 (streams2: 1, streams3: 1)"])


def test_a_foreign_schedule_with_a_violation_fails_and_is_dumped(
    pytester: pytest.Pytester,
) -> None:
    _conftest(pytester, _returning("foreign.schedule_without_exit_wait"))
    pytester.makepyfile(test_schedule=SCHEDULE_TEST)
    result = pytester.runpytest("--msched-dump=dumps")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "msched.verify found violations in the schedule:",
            "  [[]exit-not-joined[]] output on stream 0 does not wait for `capture_1` on stream 1*",
            "  > s1 |   capture_1 = msched_plugin_eng.inplace_slice_copy.default(*",
        ]
    )
    result.stdout.fnmatch_lines(["graphs scheduled: 1 (streams2: 1)", "violations: 1"])
    stem = "test_schedule.py_test_schedule_streams2.0"
    dumps = pytester.path / "dumps"
    files = sorted(p.name for p in dumps.iterdir())
    assert files == [f"{stem}.dot", f"{stem}.svg", f"{stem}.trace.json"]
    dot = (dumps / f"{stem}.dot").read_text()
    assert dot.startswith("digraph") and "capture_1" in dot

    unverified = pytester.runpytest("--msched-verify=off")
    unverified.assert_outcomes(failed=1)  # the helper catches it
    unverified.stdout.fnmatch_lines(
        [
            "E       AssertionError: output on stream 0 does not wait for capture_1 (stream 1)*",
            "violations: 0 (1 graph not verified: --msched-verify=off)",
        ]
    )


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        pytest.param(
            "def exploding(gm, num_streams):\n    raise RuntimeError('no streams today')\n\n\n"
            + _returning("exploding"),
            [
                "the scheduler conftest.exploding raised RuntimeError scheduling the graph on 2 "
                "streams: no streams today",
                "Traceback (most recent call last):",
                "*raise RuntimeError('no streams today')",
            ],
            id="raises",
        ),
        pytest.param(
            _returning("foreign.not_a_scheduler_result"),
            [
                "the scheduler tests.plugin.foreign.not_a_scheduler_result returned str; a "
                "scheduler returns the scheduled torch.fx.GraphModule, or None *"
            ],
            id="returns-str",
        ),
        pytest.param(
            _returning("'tests.plugin.foreign:schedule_copy'"),
            ["the msched_scheduler fixture returned 'tests.plugin.foreign:schedule_copy', not *"],
            id="not-callable",
        ),
    ],
)
def test_a_broken_scheduler_fails_the_test_naming_it(
    pytester: pytest.Pytester, scheduler: str, message: list[str]
) -> None:
    _conftest(pytester, scheduler)
    pytester.makepyfile(test_schedule=SCHEDULE_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(message)
    result.stdout.no_fnmatch_line("*graphs scheduled*")


def test_a_bad_dialect_fixture_fails_the_test_naming_it(pytester: pytest.Pytester) -> None:
    _conftest(pytester, _returning("foreign.schedule_copy"), dialect="42")
    pytester.makepyfile(test_schedule=SCHEDULE_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the msched_dialect fixture returned 42: dialect must be *"])


def test_a_partial_of_msched_schedule_is_msched_own_schedule(pytester: pytest.Pytester) -> None:
    _conftest(pytester, _returning("functools.partial(msched.schedule, exit_edges=True)"))
    pytester.makepyfile(
        test_partial="""
        import pytest


        @pytest.mark.multistream(streams=[3])
        def test_partial(decoder_stack, schedule_graph):
            stack = decoder_stack(n_layers=2, capture_layers=(0, 1))
            sched = schedule_graph(stack.gm)
            assert sched.gm is stack.gm and sched.assignment is not None
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["graphs scheduled: 1 (streams3: 1)", "violations: 0"])
