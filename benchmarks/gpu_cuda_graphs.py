"""Each piece of a multi-stream decoder captured as a CUDA graph and replayed.

Prepared for a machine with a GPU (none was lent when it was written; it has not run there):

1. Build `TinyDecoder` (``--layers``, ``--hidden``, MoE: parallel branches) and compile it
   piecewise with ``msched.backend(--streams, compiler=...)`` for ``compiler="fx"`` and
   ``"inductor"``, and once on one stream (the single-stream piece, the floor).
2. Check each piece statically first: ``msched.verify(..., cuda_graph=True)`` of its schedule
   (FX) or its final kernel order (Inductor).
3. Capture the whole compiled call with ``torch.cuda.graph`` on the caller's stream (every
   piece inside it: each side stream joins and rejoins the capture) and replay it; the
   output and the capture buffer must equal eager's.
4. Replay again with ``torch.cuda._sleep(--delay-cycles)`` captured on msched's stream 1 at
   the start of every piece: a missing wait shows up as a wrong number, not as luck.
5. Time eager, each compiled model called plainly, and each replay (CUDA events, median of
   ``--repeat`` after warm-up); print a table with the ratios to eager and to the
   single-stream replay.

Exits 0 with a message on a machine without CUDA (nothing to capture there), 1 when a check
fails, 0 otherwise.  Run: ``python benchmarks/gpu_cuda_graphs.py [--streams 3] [--layers 8]
[--hidden 1024] [--tokens 16] [--delay-cycles 50000000] [--repeat 50]``
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import msched
from msched.compile.native_streams import NativeStreams
from msched.models.decoders import TinyDecoder
from msched.runtime import StreamRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_streams import time_ms  # noqa: E402  (the sibling benchmark times CUDA the same way)

VARIANTS = ("fx", "inductor")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=16, help="a decode step's batch")
    parser.add_argument("--delay-cycles", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    return parser


@contextlib.contextmanager
def delayed_stream_one(cycles: int) -> Iterator[None]:
    """Stream 1 of every piece sleeps ``cycles`` when it is first switched to (both the FX
    runtime and Inductor's native streams); inside a capture the sleep is captured too."""
    install = NativeStreams.install
    set_stream = StreamRuntime.set_stream

    def native(self: NativeStreams, num_streams: int, num_events: int) -> None:
        install(self, num_streams, num_events)
        if num_streams > 1:
            with torch.cuda.stream(self.stream(1)):  # type: ignore[arg-type]
                torch.cuda._sleep(cycles)

    def runtime(self: StreamRuntime, stream: int) -> None:
        set_stream(self, stream)
        if stream == 1 and self.enabled():
            torch.cuda._sleep(cycles)

    NativeStreams.install = native  # type: ignore[method-assign]
    StreamRuntime.set_stream = runtime  # type: ignore[method-assign]
    try:
        yield
    finally:
        NativeStreams.install = install  # type: ignore[method-assign]
        StreamRuntime.set_stream = set_stream  # type: ignore[method-assign]


def compiled(model: TinyDecoder, streams: int, compiler: str) -> tuple[Any, Any]:
    """The backend (its pieces) and the compiled model."""
    torch._dynamo.reset()
    b = msched.backend(num_streams=streams, compiler=compiler, piecewise=True)
    return b, torch.compile(model, backend=b)


def capture_safe(b: Any) -> bool:
    """Every piece passes ``verify(..., cuda_graph=True)``; prints each that does not."""
    ok = True
    for piece in b.pieces:
        program = piece.kernel_order if piece.kernel_order is not None else piece.gm
        report = msched.verify(program, cuda_graph=True)
        if not report.ok:
            print(f"  {piece.name}: {report}")
            ok = False
    return ok


class Replay:
    """``fn(x, cap)`` captured in a ``torch.cuda.graph`` on the caller's stream."""

    def __init__(self, fn: Callable[..., Any], x: torch.Tensor, cap: torch.Tensor) -> None:
        self.x, self.cap = x.clone(), torch.zeros_like(cap)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (compile, allocate) outside the capture
            for _ in range(2):
                fn(self.x, self.cap)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(self.x, self.cap)

    def __call__(self) -> torch.Tensor:
        self.cap.zero_()
        self.graph.replay()
        return self.out


def equal_eager(name: str, got: Any, cap: Any, expected: Any, expected_cap: Any) -> bool:
    torch.cuda.synchronize()
    ok = torch.allclose(got, expected, atol=1e-3) and torch.allclose(cap, expected_cap, atol=1e-3)
    print(f"{name:32s} {'equal to eager' if ok else 'DIFFERS from eager'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_cuda_graphs.py needs a CUDA device: torch.cuda.is_available() is False; skipped")
        return 0
    model = TinyDecoder(args.layers, args.hidden, (1, args.layers - 1), moe=True).cuda()
    x, cap = (t.cuda() for t in model.example_inputs(args.tokens))
    ok, times = True, {}
    with torch.no_grad():
        expected_cap = torch.zeros_like(cap)
        expected = model(x, expected_cap)
        times["eager"] = time_ms(lambda: model(x, cap), args.repeat, "cuda")
        for compiler in VARIANTS:
            for streams in (1, args.streams):
                name = f"{compiler}, {streams} stream(s)"
                b, fn = compiled(model, streams, compiler)
                fn(x, torch.zeros_like(cap))
                ok &= capture_safe(b)
                times[name] = time_ms(lambda fn=fn: fn(x, cap), args.repeat, "cuda")
                replay = Replay(fn, x, cap)
                ok &= equal_eager(f"{name}, replay", replay(), replay.cap, expected, expected_cap)
                times[f"{name}, replay"] = time_ms(replay, args.repeat, "cuda")
                if streams > 1:
                    with delayed_stream_one(args.delay_cycles):
                        delayed = Replay(fn, x, cap)
                    got = delayed()
                    ok &= equal_eager(
                        f"{name}, replay, delay", got, delayed.cap, expected, expected_cap
                    )
    print_table(times, args.streams)
    return 0 if ok else 1


def print_table(times: dict[str, float], streams: int) -> None:
    """Each timing with its ratio to eager and, for replays, to the single-stream replay."""
    print(f"{'variant':32s} {'ms':>9s} {'/eager':>7s} {'/1-stream replay':>16s}")
    for name, ms in times.items():
        floor = next((times[k] for k in times if k.endswith("1 stream(s), replay") and
                      k.split(",")[0] == name.split(",")[0]), None)  # fmt: skip
        vs_floor = f"{ms / floor:16.2f}" if floor and name.endswith("replay") else f"{'':16s}"
        print(f"{name:32s} {ms:9.3f} {ms / times['eager']:7.2f} {vs_floor}")


if __name__ == "__main__":
    sys.exit(main())
