"""What `msched.UnreadStreamOpsError` advises when the plugin reads a graph: its own option.

The helpers, ``schedule_graph`` and the snapshots take the dialect from ``msched_dialect``
(ini, ``--msched-dialect`` or a ``conftest.py`` fixture), so their error says so; a function
of msched's called in a test takes no default from pytest, so its error keeps saying
``dialect=``.  The engine is `tests.plugin.myeng`, whose stream ops no built-in dialect reads.
"""

from __future__ import annotations

import copy

import pytest

import msched
from msched.errors import LIBRARY_DIALECT_HINT
from pytest_msched import assert_race_free
from pytest_msched._reading import PLUGIN_DIALECT_HINT
from pytest_msched.snapshot import ScheduledGraphExtension
from tests.plugin import myeng


def test_a_helper_and_a_snapshot_name_the_plugins_option_msched_its_own() -> None:
    gm = myeng.model()
    original = copy.deepcopy(gm)
    myeng.schedule(gm, 3)
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        assert_race_free(gm, original)
    assert raised.value.hint == PLUGIN_DIALECT_HINT
    assert "`msched_dialect = package.module:DIALECT` in the ini file" in str(raised.value)
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        ScheduledGraphExtension().serialize(gm)
    assert raised.value.hint == PLUGIN_DIALECT_HINT
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        msched.verify(gm, original=original)
    assert raised.value.hint == LIBRARY_DIALECT_HINT
    assert "msched_dialect" not in str(raised.value)


def test_schedule_graph_names_the_plugins_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmsched_scheduler = tests.plugin.myeng:schedule\n")
    pytester.makepyfile(
        test_engine="""
        import pytest
        from tests.plugin import myeng

        @pytest.mark.multistream(streams=[3])
        def test_engine(schedule_graph):
            schedule_graph(myeng.model())
        """
    )
    result = pytester.runpytest("-p", "no:hypothesispytest")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*look like stream ops but the msched dialect does not read them*"
            "Give the dialect of these ops: configure it for pytest-msched's helpers, "
            "schedule_graph and snapshots: `msched_dialect = package.module:DIALECT`*"
        ]
    )
