"""Real ``transformers`` decoders, tensor-parallel on two gloo ranks, through both compilers.

Llama and Qwen2 (tiny, random, one model on both ranks; Qwen2's q/k/v have biases), each
sharded by hand as engines do it (column-parallel q/k/v/gate/up, row-parallel o/down with
functional all-reduces) and with DTensor's ``parallelize_module``
(`sharded_transformers`), compiled with ``msched.backend(num_streams=2, compiler=...)``
whole and piecewise, with an Eagle3 capture of three hidden states.  On every rank the
logits and the capture equal the unsharded model's in eager on two calls, every piece
verifies, and both ranks issue the same collectives on the same group in the same order:
one all-reduce per row-parallel projection, two per layer.

Every build takes from about 20 s (``fx``) to minutes (``inductor``, a C++ compile per
rank) on CPU: all are in the slow tier, which ``.ci/run`` runs on torch 2.13.  Two of them
(one per compiler, sharding and build) are also marked ``real_models``: ``.ci/run`` runs
those on the newest torch too, as it does every other real model's build; all sixteen do
not fit in its 45 minutes twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from tests.msched.compile import transformers_models as models  # noqa: E402
from tests.msched.compile.sharded_transformers import SHARDINGS, sharded_run  # noqa: E402

pytestmark = [
    # Dynamo breaks a transformers decoder's graph (its own Python): the pieces without
    # attention are one piece each.
    pytest.mark.filterwarnings("ignore::msched.errors.SplitOpNotFoundWarning"),
    pytest.mark.slow,
]

FAMILIES = models.chosen(("llama", "qwen2"))  # ``MSCHED_REAL_MODELS`` chooses, too
BUILDS = {"whole": False, "piecewise": True}
#: The cases run on the newest torch too (``real_models``): each compiler, sharding and build.
ON_EVERY_TORCH = {("llama", "hand", "inductor", "whole"), ("qwen2", "dtensor", "fx", "piecewise")}


def _case(family: str, sharding: str, compiler: str, build: str) -> Any:
    on_every = (family, sharding, compiler, build) in ON_EVERY_TORCH
    return pytest.param(
        family,
        sharding,
        compiler,
        build,
        id=f"{family}-{sharding}-{compiler}-{build}",
        marks=[pytest.mark.real_models] if on_every else [],
    )


CASES = [
    _case(family, sharding, compiler, build)
    for family in FAMILIES
    for sharding in SHARDINGS
    for compiler in ("fx", "inductor")
    for build in BUILDS
]


@pytest.mark.parametrize(("family", "sharding", "compiler", "build"), CASES)
def test_a_sharded_transformers_decoder_equals_the_unsharded_one_on_every_rank(
    family: str,
    sharding: str,
    compiler: str,
    build: str,
    tmp_path,
    msched_ranks: Callable[..., list[Any]],
) -> None:
    ranks = msched_ranks(
        sharded_run, family, sharding, compiler, BUILDS[build], str(tmp_path), timeout=900.0
    )
    for found in ranks:
        for got, want, got_capture, want_capture in found["runs"]:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(got_capture, want_capture, atol=1e-5, rtol=1e-4)
            assert got_capture.abs().sum() > 0
        assert found["verified"] and all(found["verified"]), found["reports"]
        assert found["reduces"] == 2 * models.LAYERS
        ops = [(op, group) for op, group, _ in found["collectives"]]
        assert ops == [("all_reduce", "0")] * found["reduces"]
        if BUILDS[build]:  # split at attention: more pieces than Dynamo's graphs
            assert found["pieces"] > found["graphs"]
    first, second = (found["collectives"] for found in ranks)
    assert first == second  # the same all-reduces, by name, in the same order
