"""docs/costs.md's ``conftest.py``: overriding ``schedule_graph`` gives every test the cost
model measured on the engine's GPU (read from a committed file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import msched

DOCS = Path(__file__).resolve().parents[2] / "docs" / "costs.md"

TEST = """
from pathlib import Path

import msched
from msched.models.decoders import decoder_stack


def test_scheduled_with_the_files_costs(schedule_graph, num_streams):
    sched = schedule_graph(decoder_stack(n_layers=2, capture_layers=(1,)).gm)
    loaded = msched.MeasuredCostModel.load(Path("tests") / "costs.json")
    fresh = [decoder_stack(n_layers=2, capture_layers=(1,)).gm for _ in range(2)]
    expected = msched.schedule(fresh[0], num_streams, loaded)
    default = msched.schedule(fresh[1], num_streams)
    assert sched.makespan == expected.makespan != default.makespan
"""


def _conftest_of_the_docs() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    return next(b for b in blocks if "def schedule_graph(schedule_graph" in b)


def test_the_documented_override_schedules_with_the_committed_costs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(_conftest_of_the_docs())
    (pytester.path / "tests").mkdir()
    costs = msched.MeasuredCostModel(
        {}, {"aten.mm.default": 100.0}, device="cuda:0", device_name="a GPU",
        torch_version="2.13.0", warmup=3, repeats=10,
    )  # fmt: skip
    costs.save(pytester.path / "tests" / "costs.json")
    pytester.makepyfile(TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)  # on 2 and 3 streams
