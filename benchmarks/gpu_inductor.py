"""TinyDecoder compiled four ways on CUDA: eager, Inductor, msched fx, msched + Inductor.

Prepared for a machine with a GPU (none was lent when it was written; it has not run there):

1. Build `TinyDecoder` (``--layers``, ``--hidden``, MoE: parallel branches) and its inputs.
2. Compile it with Inductor without streams (``backend="inductor"``), with
   ``msched.backend(num_streams, compiler="fx")`` and with ``compiler="inductor"``.
3. Check each against eager (output and capture buffer), then again with
   ``torch.cuda._sleep(--delay-cycles)`` enqueued on msched's stream 1 at the start of every
   call (a missing wait then shows up as a wrong number, not as luck).
4. Time a forward of each (CUDA events, median of ``--repeat`` after warm-up).
5. Capture the ``compiler="inductor"`` model in a ``torch.cuda.graph`` and replay it; the
   replay must equal eager.

Exits 1 with a message on a machine without CUDA (nothing to measure there), 1 when a check
fails, 0 otherwise.  Run: ``python benchmarks/gpu_inductor.py [--streams 3] [--layers 8]
[--hidden 1024] [--tokens 512] [--delay-cycles 50000000] [--repeat 20]``
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_streams import time_ms  # noqa: E402  (the sibling benchmark times CUDA the same way)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--delay-cycles", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    return parser


@contextlib.contextmanager
def delayed_stream_one(cycles: int) -> Iterator[None]:
    """Every compiled piece's stream 1 sleeps ``cycles`` at the start of each call."""
    original = NativeStreams.install

    def install(self: NativeStreams, num_streams: int, num_events: int) -> None:
        original(self, num_streams, num_events)
        if num_streams > 1:
            with torch.cuda.stream(self.stream(1)):  # type: ignore[arg-type]
                torch.cuda._sleep(cycles)

    NativeStreams.install = install  # type: ignore[method-assign]
    try:
        yield
    finally:
        NativeStreams.install = original  # type: ignore[method-assign]


def variants(model: TinyDecoder, streams: int) -> dict[str, Callable[..., Any]]:
    torch._dynamo.reset()
    return {
        "eager": model,
        "inductor": torch.compile(model, backend="inductor"),
        "msched fx": torch.compile(model, backend=msched.backend(num_streams=streams)),
        "msched inductor": torch.compile(
            model, backend=msched.backend(num_streams=streams, compiler="inductor")
        ),
    }


def check(name: str, fn: Callable[..., Any], model: TinyDecoder, x: Any, cap: Any) -> bool:
    expected_cap = torch.zeros_like(cap)
    expected = model(x, expected_cap)
    got_cap = torch.zeros_like(cap)
    got = fn(x, got_cap)
    ok = torch.allclose(got, expected, atol=1e-3) and torch.allclose(
        got_cap, expected_cap, atol=1e-3
    )
    print(f"{name:24s} {'equal to eager' if ok else 'DIFFERS from eager'}")
    return ok


def graph_replay(fn: Callable[..., Any], model: TinyDecoder, x: Any, cap: Any) -> bool:
    static_cap = torch.zeros_like(cap)
    fn(x, static_cap)  # warm up (compiles) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x, static_cap)
    static_cap.zero_()
    graph.replay()
    torch.cuda.synchronize()
    expected_cap = torch.zeros_like(cap)
    ok = torch.allclose(out, model(x, expected_cap), atol=1e-3)
    ok = ok and torch.allclose(static_cap, expected_cap, atol=1e-3)
    print(f"{'cuda graph replay':24s} {'equal to eager' if ok else 'DIFFERS from eager'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_inductor.py needs a CUDA device: torch.cuda.is_available() is False")
        return 1
    model = TinyDecoder(args.layers, args.hidden, (1, args.layers - 1), moe=True).cuda()
    x, cap = (t.cuda() for t in model.example_inputs(args.tokens))
    ok = True
    with torch.no_grad():
        compiled = variants(model, args.streams)
        for name, fn in compiled.items():
            ok &= check(name, fn, model, x, cap)
        with delayed_stream_one(args.delay_cycles):
            ok &= check("msched inductor, delay", compiled["msched inductor"], model, x, cap)
        for name, fn in compiled.items():
            ms = time_ms(lambda fn=fn: fn(x, cap), args.repeat, "cuda")
            print(f"{name:24s} {ms:9.3f} ms per forward (median of {args.repeat})")
        ok &= graph_replay(compiled["msched inductor"], model, x, cap)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
