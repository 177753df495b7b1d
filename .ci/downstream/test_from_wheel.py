"""A downstream repository's test, run against the installed wheel (not the checkout).

It uses what users use: the marker, the fixtures, the helpers, a snapshot, and imports from
every subpackage, so a wheel that lacks a subpackage, a data file or the plugin's entry point
fails here.  `.ci/run` runs it three times: ``--snapshot-update`` writes the snapshot, then a
plain run and a run under ``-n 2`` must match it (the README's Install section promises all
three).
"""

import pytest
import torch

import msched
from msched.analysis.effects import compute_effects
from msched.compile.compiler import backend
from msched.models.decoders import decoder_stack as make_stack
from msched.pictures.text import render_text
from msched.proof.verifier import verify
from msched.scheduling.pipeline import schedule
from pytest_msched import assert_captures_precede_output, assert_race_free


@pytest.mark.multistream(streams=[2, 3])
def test_eagle3_capture_is_joined(decoder_stack, schedule_graph, num_streams, graph_snapshot):
    stack = decoder_stack(n_layers=4, capture_layers=(1, 3))
    sched = schedule_graph(stack.gm)
    assert sched.num_streams == num_streams
    assert_captures_precede_output(sched.gm, stack.captures)
    assert_race_free(sched.gm, sched.original)
    x, dest = stack.example_inputs()
    sched.gm(x, dest)
    assert torch.equal(dest, stack.reference()[1])
    assert sched == graph_snapshot


def test_every_subpackage_comes_from_the_wheel():
    stack = make_stack(3, (2,))
    assert compute_effects(stack.gm.graph).side_effects
    sched = schedule(stack.gm, 2)
    assert schedule is msched.schedule and verify(sched.gm, original=sched.original).ok
    assert callable(backend(num_streams=2))
    assert render_text(sched).startswith("# msched text format 2\n# streams 2, events ")
    assert "site-packages" in msched.__file__
