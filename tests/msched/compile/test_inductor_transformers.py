"""``msched.backend(compiler="inductor")`` on real ``transformers`` decoders (the extra).

Twelve tiny random families with Eagle3 captures, and Llama over a static KV cache
(`transformers_models`), each compiled whole on 3 streams and piecewise on 2: 26 builds.
Each equals eager on two calls (the logits, the capture buffer or the cache), every piece's
final kernel order verifies, kernels run on a side stream, and a piecewise build splits at
attention (more than one piece).

Before the fixes of the Inductor real-models issue, 17 of these builds were refused: a
capture's ``slice_scatter``, rebuilt by an Inductor pass after msched's, ran on the caller's
stream without the waits msched placed (Gemma, Qwen3, Mixtral, ...); a ``cat`` lowered into
one copy per input let the copy of another stream's slice run before its wait (Phi's partial
rotary embedding, DeepSeek-V3's MLA); and no piecewise build split.

Every build costs Inductor's C++ compile on CPU: all are in the slow tier.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import msched
from msched.compile.compiler import MschedBackend
from msched.compile.kernel_order import kernel_names

pytest.importorskip("transformers")

from tests.msched.compile import transformers_models as models  # noqa: E402

pytestmark = [
    # Builds whose graph Dynamo breaks (transformers' own Python) keep one piece per graph.
    pytest.mark.filterwarnings("ignore::msched.errors.SplitOpNotFoundWarning"),
    # ``-m "not slow or real_models"``: the default tier and these builds in one run.
    pytest.mark.real_models,
    # Every compile here runs msched's pass (nothing comes from an earlier run's cache; no
    # two builds here compile one graph with one configuration), and the kernels the builds
    # share (the families have layers alike) are compiled once per run, not once per worker.
    pytest.mark.usefixtures("run_inductor_cache"),
]

#: (streams, piecewise) of the two builds of every model.
BUILDS = {"whole": (3, False), "piecewise": (2, True)}
#: The models to build (`models.ONLY`: ``MSCHED_REAL_MODELS=gemma,phi`` builds those only).
NAMES = models.chosen(models.NAMES)


def _clone(values):
    return [v.clone() for v in values]


def _state(module, inputs):
    """What a call leaves behind: the module's buffers, a static cache's keys and values
    (not buffers: a ``StaticCache`` is no module) and its inputs."""
    cache = getattr(module, "cache_tensors", list)()
    return [b.clone() for b in module.buffers()] + _clone(cache) + _clone(inputs)


def compile_and_run(name, build, **ablations):
    """Eager and compiled twins of model ``name``; per call the output and left state.
    ``ablations`` turn protections of the backend's config off (``tie_waits=False``)."""
    streams, piecewise = BUILDS[build]
    eager, make_inputs = models.build(name)
    twin, _ = models.build(name)
    twin.load_state_dict(eager.state_dict())
    b = msched.backend(num_streams=streams, compiler="inductor", piecewise=piecewise)
    if ablations:
        b = MschedBackend(dataclasses.replace(b.config, **ablations))
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend=b)
    runs = []
    with torch.no_grad():
        for _ in range(2):
            inputs = make_inputs()
            mine = _clone(inputs)
            want = eager(*inputs)
            got = compiled(*mine)
            runs.append(((want, _state(eager, inputs)), (got, _state(twin, mine))))
    return b, runs


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((name, build), marks=pytest.mark.slow, id=f"{name}-{build}")
        for name in NAMES
        for build in BUILDS
    ],
)
def built(request):
    name, build = request.param
    return name, build, *compile_and_run(name, build)


def test_equals_eager_on_two_calls(built) -> None:
    name, _, _, runs = built
    for (want, want_state), (got, got_state) in runs:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for mine, theirs in zip(got_state, want_state, strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    written = runs[0][1][1]
    assert any(s.is_floating_point() and s.abs().sum() > 0 for s in written), name
    if name == "static-cache":  # its keys and values, per layer, are compared above
        assert len(written) >= 2 * models.LAYERS


def test_every_piece_verifies_with_kernels_on_a_side_stream(built) -> None:
    _, build, b, _ = built
    assert b.pieces
    streams = set()
    for piece in b.pieces:
        assert piece.report is not None and piece.report.ok, piece.report
        assert kernel_names(piece.kernel_order)
        streams |= {n.meta.get("custom", {}).get("stream") for n in piece.kernel_order.graph.nodes}
    assert None in streams and len(streams) >= 2  # the caller's stream and a side stream
    if build == "piecewise":
        assert len(b.pieces) > 1  # split at attention


@pytest.mark.slow
@pytest.mark.parametrize("ablation", ["tie_waits", "guard_reuse"])
def test_without_the_ties_or_the_reuse_guard_a_real_model_is_refused(ablation) -> None:
    """The checks above are not vacuous: without either protection, Inductor's final order
    of a real model has a race the verifier names."""
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as failed:
        compile_and_run("gemma", "whole", **{ablation: False})
    inner = failed.value.inner_exception
    assert isinstance(inner, msched.PieceVerificationError)
    assert inner.report is not None and not inner.report.ok
