"""Which private torch interfaces msched reads answer as msched expects, in the installed torch.

`msched versions` prints this report: when torch releases, a maintainer runs it on the new
release and sees in a minute which interface changed, instead of reading it out of dozens of
failing tests.  Each `Interface` names what msched reads, the one file that holds msched's use
of it (the file to change), the tests that cover it and the torch releases it was checked on.

Two kinds of rows:

- presence: every attribute listed in `msched._torch_internals.TORCH_INTERFACES` and
  `msched.compile._inductor_internals.INTERFACES` exists;
- behaviour: a probe runs the smallest program that uses a group of interfaces the way msched
  does (Dynamo's stream table, tracing a stream program at each stage, an Inductor build on
  two streams) and reports the first error it raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from msched import _torch_internals as ti
from msched.compile import _inductor_internals as ii

#: The torch releases every interface below was checked on (CI runs 2.13.0 and 2.15.0; the
#: 2.14.1 column was checked when 2.15 support landed).
CHECKED_ON = ("2.13.0", "2.14.1", "2.15.0")

_TORCH_FILE = "msched/_torch_internals.py"
_INDUCTOR_FILE = "msched/compile/_inductor_internals.py"
_TORCH_TESTS = "tests/msched/test_torch_internals.py"
_INDUCTOR_TESTS = "tests/msched/compile/test_inductor_internals.py"


@dataclass(frozen=True)
class Interface:
    """One row of the report: ``problem`` is None when the interface answers as expected."""

    name: str
    file: str
    tests: str
    problem: str | None
    checked_on: tuple[str, ...] = CHECKED_ON

    @property
    def ok(self) -> bool:
        return self.problem is None


def _probe(run: Callable[[], object]) -> str | None:
    """None when ``run()`` returns, else its error in one line."""
    try:
        run()
    except Exception as error:  # noqa: BLE001 - the report says what broke, whatever it is
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
    return None


def _present(module: str, path: str) -> str | None:
    return None if ii.attribute_exists(module, path) else f"torch {torch.__version__} lacks it"


def _stream_table() -> None:
    ti.dynamo_external_objects()


def _side_stream_program(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream() if torch.accelerator.is_available() else None
    side = torch.Stream(device=x.device)
    event = torch.Event(device=x.device)
    with side:
        y = x.relu()
        event.record(side)
    event.wait(caller) if caller is not None else event.wait()
    return y + 1


def _trace(stage: str) -> Callable[[], object]:
    def run() -> object:
        from msched.compile.tracing import trace_streams

        return trace_streams(_side_stream_program, torch.randn(4), stage=stage)

    return run


def _inductor_build() -> None:
    from msched.compile.compiler import backend, compile_and_run

    class TwoBranches(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sin() @ x.T + x.cos() @ x.T

    b = backend(num_streams=2, compiler="inductor", verify=True)
    compile_and_run(TwoBranches(), [torch.randn(8, 8)], b)


#: The behaviour probes: (what they exercise, the file holding msched's use, its tests, probe).
_PROBES: tuple[tuple[str, str, str, Callable[[], object]], ...] = (
    (
        "Dynamo's external-object table (a dict before 2.15, a list in 2.15)",
        _TORCH_FILE,
        _TORCH_TESTS,
        _stream_table,
    ),
    (
        "trace_streams at the Dynamo stage (SymbolicStreamState, the stream table)",
        _TORCH_FILE,
        "tests/msched/compile/test_tracing.py",
        _trace("dynamo"),
    ),
    (
        "trace_streams after AOT autograd (aot_autograd, control_deps of stream ops)",
        _TORCH_FILE,
        "tests/msched/compile/test_tracing.py",
        _trace("aot"),
    ),
    (
        "an Inductor build on 2 streams, its kernel order verified (the Inductor hooks)",
        _INDUCTOR_FILE,
        "tests/msched/compile/test_inductor_backend.py",
        _inductor_build,
    ),
)


def check_interfaces(probes: bool = True) -> tuple[Interface, ...]:
    """Every interface of the report, checked in the installed torch (``probes=False``: the
    presence rows only, which take no compile).  An interface both internals modules read
    (Dynamo's stream table, say) is one row naming both files."""
    listed: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for owner, tests, entries in (
        (_TORCH_FILE, _TORCH_TESTS, ti.TORCH_INTERFACES),
        (_INDUCTOR_FILE, _INDUCTOR_TESTS, ii.INTERFACES),
    ):
        for entry in entries:
            files, covering = listed.setdefault(entry, ([], []))
            files.append(owner)
            covering.append(tests)
    rows = [
        Interface(f"{m}.{p}", " and ".join(f), ", ".join(t), _present(m, p))
        for (m, p), (f, t) in listed.items()
    ]
    if probes:
        rows += [Interface(name, f, tests, _probe(run)) for name, f, tests, run in _PROBES]
    return tuple(rows)


def render_report(rows: tuple[Interface, ...], seconds: float | None = None) -> str:
    """The report `msched versions` prints: a line per interface, failures first."""
    failed = [r for r in rows if not r.ok]
    lines = [
        f"torch {torch.__version__}; msched tested with {ti.tested_range()}"
        + ("" if ti.untested_version_message() is None else " (this torch is outside it)"),
        f"{len(rows) - len(failed)} of {len(rows)} interfaces answer as expected"
        + (f" ({seconds:.0f} s)" if seconds is not None else ""),
    ]
    for row in failed:
        lines += [f"CHANGED  {row.name}", f"         {row.problem}"]
        lines += [f"         change {row.file}; tests: {row.tests}"]
    lines += [f"ok       {row.name}" for row in rows if row.ok]
    lines.append(f"(each checked on torch {', '.join(CHECKED_ON)}; see CONTRIBUTING.md)")
    return "\n".join(lines) + "\n"


def report(probes: bool = True) -> tuple[str, bool]:
    """The rendered report of the installed torch and whether every interface answered."""
    start = time.monotonic()
    rows = check_interfaces(probes)
    return render_report(rows, time.monotonic() - start), all(r.ok for r in rows)


__all__ = ["CHECKED_ON", "Interface", "check_interfaces", "render_report", "report"]
