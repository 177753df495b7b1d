"""Soundness on graphs traced from model code: msched never moves a read across a write.

For every model of the corpus (`tests.msched.soundness_cases`), on 2 and 3 streams, through
``torch.fx.symbolic_trace`` + `msched.schedule` and through ``torch.compile`` with
`msched.backend`:

- the scheduled module called plainly, and `msched.execute` in every adversarial order,
  give the outputs, the mutated inputs and the buffers of eager PyTorch;
- `msched.verify` against the unscheduled original finds nothing;
- the schedule has waits, and removing any one of them is a violation `msched.verify`
  reports (emission emits only necessary waits, so none is redundant).

All checks of a configuration run, and a failure lists every check that failed.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.fx import GraphModule

import msched
from msched.compile.compiler import Piece
from msched.testing.traced import record_piece_inputs

from ..faults import inject
from ..soundness_cases import CASES, Case, build, fx_trace

ORDERS = ("late-aux", "early-aux", "random")
RANDOM_SEEDS = (0, 1)
RNG_SEED = 7
STREAMS = (2, 3)


@dataclass
class Problems:
    """The checks of one configuration that failed, each with a one-line reason."""

    failed: list[str] = field(default_factory=list)

    @contextmanager
    def check(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:  # every failure is reported at the end
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            text = " | ".join(lines) or type(error).__name__
            self.failed.append(f"{what}: {type(error).__name__}: {text[:400]}")
            if not isinstance(error, AssertionError):
                self.failed.append("".join(traceback.format_exception(error)[-3:]))

    def raise_if_any(self) -> None:
        if self.failed:
            pytest.fail("\n".join(self.failed), pytrace=False)


@dataclass(frozen=True)
class Observed:
    """What a run left behind: the outputs, the inputs and the module's state."""

    output: Any
    inputs: tuple[Any, ...]
    state: dict[str, Tensor]


def state_of(module: nn.Module) -> dict[str, Tensor]:
    """Clones of every buffer and parameter of ``module``, under each of its names."""
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]  # fmt: skip
    return {name: t.detach().clone() for name, t in named}


def restore(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Put ``state`` (from `state_of`) back into ``module``'s own tensors."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(remove_duplicate=False),
                        *module.named_buffers(remove_duplicate=False)]:  # fmt: skip
            t.copy_(state[name])


def assert_same(got: Observed, want: Observed, where: str) -> None:
    torch.testing.assert_close(got.output, want.output, msg=lambda m: f"{where}: output: {m}")
    torch.testing.assert_close(got.inputs, want.inputs, msg=lambda m: f"{where}: inputs: {m}")
    # A traced module holds the model's tensors that its graph uses, under the same names
    # (and constants and attribute views of its own, which the model has no name for).
    for key in sorted(set(got.state) & set(want.state)):
        torch.testing.assert_close(
            got.state[key], want.state[key], msg=lambda m, k=key: f"{where}: buffer {k}: {m}"
        )


@contextmanager
def rng(case: Case) -> Iterator[None]:
    """Seed the global generator for a random case (restored afterwards)."""
    with torch.random.fork_rng():
        if case.random:
            torch.manual_seed(RNG_SEED)
        yield


def call(module: Callable[..., Any], case: Case, inputs: tuple[Tensor, ...] | None = None) -> Any:
    inputs = case.inputs() if inputs is None else inputs
    with torch.no_grad(), rng(case):
        output = module(*inputs)
    return output, inputs


def eager(case: Case) -> Observed:
    model = build(case)
    output, inputs = call(model, case)
    return Observed(output, inputs, state_of(model))


def run_module(gm: nn.Module, case: Case) -> Observed:
    """Call ``gm`` on fresh inputs, then put its state back as it was."""
    initial = state_of(gm)
    output, inputs = call(gm, case)
    observed = Observed(output, inputs, state_of(gm))
    restore(gm, initial)
    return observed


def executions(
    gm: GraphModule, inputs: Callable[[], tuple[Any, ...]], case: Case
) -> Iterator[tuple[str, msched.Execution, tuple[Any, ...]]]:
    """`msched.execute` of ``gm`` in every order (and several seeds), each run starting
    from the state ``gm`` has now."""
    initial = state_of(gm)
    for order in ORDERS:
        for seed in RANDOM_SEEDS if order == "random" else (0,):
            restore(gm, initial)
            args = inputs()
            with torch.no_grad(), rng(case):
                run = msched.execute(gm, *args, order=order, seed=seed)
            yield f"{order}/{seed}" if order == "random" else order, run, args
    restore(gm, initial)


def check_execute(
    p: Problems,
    gm: GraphModule,
    inputs: Callable[[], tuple[Any, ...]],
    want: Observed,
    case: Case,
    where: str,
) -> None:
    for order, run, args in executions(gm, inputs, case):
        with p.check(f"{where}: execute {order}"):
            assert run.after_output == (), f"ran after output: {run.after_output}"
            # Nothing ran after output, so the state now is the state at output.
            at_output = Observed(run.output, run.inputs_at_output, state_of(gm))
            assert_same(at_output, want, f"{where}: execute {order}")
            assert_same(Observed(run.output, args, state_of(gm)), want, f"{where}: {order} end")


def check_waits(p: Problems, gm: GraphModule, original: GraphModule, where: str) -> int:
    """Every wait of ``gm`` is needed: removing it is reported by verify.  Returns #waits."""
    waits = 0
    for fault in inject("drop-wait", gm, original):
        waits += 1
        with p.check(f"{where}: without {fault.site}"):
            report = msched.verify(fault.gm, original=original)
            assert not report.ok, "verify finds nothing wrong with a wait removed"
    return waits


def skip_unless(reason: str | None) -> None:
    if reason is not None:
        pytest.skip(reason)


# --- front end (a): torch.fx.symbolic_trace + msched.schedule ----------------------------


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_symbolic_trace(case: Case, streams: int) -> None:
    skip_unless(case.no_fx)
    want = eager(case)
    model = build(case)
    built = state_of(model)
    gm = fx_trace(model, case.leaves)
    # The tracer's own fidelity first: tracing ran no write on the model (fx runs code that
    # involves no traced value), and the unscheduled graph computes what eager does.
    for name, value in state_of(model).items():
        assert torch.equal(value, built[name]), f"tracing wrote {name}"
    assert_same(run_module(gm, case), want, "traced, unscheduled")
    p = Problems()
    sched = msched.schedule(gm, streams)
    with p.check("verify"):
        report = msched.verify(gm, original=sched.original, num_streams=streams)
        assert report.ok, str(report)
    with p.check("scheduled call"):
        assert_same(run_module(gm, case), want, "scheduled call")
    check_execute(p, gm, case.inputs, want, case, "fx")
    waits = check_waits(p, gm, sched.original, "fx")
    with p.check("waits"):
        assert waits >= 1, "the schedule has no wait: the case does not exercise two streams"
    p.raise_if_any()


# --- front end (b): torch.compile(backend=msched.backend(...)) ---------------------------


def compile_case(case: Case, streams: int) -> tuple[nn.Module, Callable[..., Any], Any]:
    torch._dynamo.reset()
    model = build(case)
    b = msched.backend(num_streams=streams)
    return model, torch.compile(model, backend=b), b


def check_piece(p: Problems, piece: Piece, seen: tuple[Any, ...], case: Case, streams: int) -> int:
    """`check_execute` and `check_waits` of one piece, against its unscheduled original run
    on what the piece was called with.  Returns the number of waits."""
    where = piece.name
    original = piece.schedule.original
    with p.check(f"{where}: verify"):
        report = msched.verify(piece.gm, original=original, num_streams=streams)
        assert report.ok, str(report)

    def inputs() -> tuple[Any, ...]:
        return tuple(v.clone() if isinstance(v, Tensor) else v for v in seen)

    reference = copy.deepcopy(original)
    output, args = call(reference, case, inputs())
    want = Observed(output, args, state_of(reference))
    check_execute(p, piece.gm, inputs, want, case, where)
    return check_waits(p, piece.gm, original, where)


@pytest.mark.slow
@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_torch_compile(case: Case, streams: int) -> None:
    skip_unless(case.no_dynamo)
    want = eager(case)
    model, compiled, b = compile_case(case, streams)
    p = Problems()
    got, inputs = call(compiled, case)  # compiles: msched schedules and verifies each piece
    with p.check("compiled call"):
        assert_same(Observed(got, inputs, state_of(model)), want, "compiled call")
    assert b.pieces, "torch.compile handed msched no graph"
    with record_piece_inputs(b.pieces) as seen:
        call(compiled, case)  # once more, to record what each piece is called with
    waits = 0
    for piece in b.pieces:
        if piece.name in seen:
            waits += check_piece(p, piece, seen[piece.name], case, streams)
    with p.check("waits"):
        assert waits >= 1, "no piece has a wait: the case does not exercise two streams"
    p.raise_if_any()
