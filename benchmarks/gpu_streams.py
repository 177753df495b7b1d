"""The compiled multi-stream TinyDecoder on real CUDA streams: correctness under delay, timing.

1. Compile `TinyDecoder` (piecewise, ``--streams`` streams) with `msched.backend` whose
   runtime puts ``torch.cuda._sleep(--delay-cycles)`` at the start of every switch to an
   auxiliary stream.  Work on the auxiliary streams then lands late, so a wait the schedule
   is missing (the exit not joining a capture, a consumer not waiting for its producer) shows
   up as a wrong number instead of passing by luck.
2. Run it on fresh inputs and compare the output and the capture buffer with eager, read on
   the caller's stream right after the call (what a drafter would do).
3. Time eager, the 1-stream and the multi-stream compiled model (no delay; CUDA events,
   median of ``--repeat`` runs after warm-up).

``--ablate`` schedules without exit edges (the ``exit_edges=False`` ablation of
`msched.schedule`, verification off): the delayed capture on an auxiliary stream is then
expected to be missing or stale.

Exits 0 with a message on a machine without CUDA (``--device cpu`` runs the same steps on
CPU, without delays, to smoke-test the script); 1 when a check fails.
Run: ``python benchmarks/gpu_streams.py [--streams 3] [--layers 12] [--hidden 1024]
[--tokens 512] [--moe] [--delay-cycles 50000000] [--repeat 20] [--ablate]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from msched.compile import compiler as backend_module
from msched.models.decoders import TinyDecoder
from msched.runtime import StreamRuntime


class DelayedAuxRuntime(StreamRuntime):
    """A StreamRuntime that makes every auxiliary stream start its work late."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles

    def set_stream(self, stream: int) -> None:
        super().set_stream(stream)
        if stream != 0 and self.cycles and self.enabled():
            torch.cuda._sleep(self.cycles)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--delay-cycles", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--ablate", action="store_true", help="schedule without exit edges")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    return parser.parse_args(argv)


def compile_model(
    model: TinyDecoder,
    inputs: tuple[torch.Tensor, ...],
    streams: int,
    runtime: Callable[[], StreamRuntime],
    ablate: bool,
) -> Callable[..., Any]:
    """Compile with msched's backend (piecewise) and run once on ``inputs`` to compile."""
    config = backend_module.BackendConfig(
        num_streams=streams,
        piecewise=True,
        split_ops=(torch.ops.msched.attention,),
        verify=not ablate,
        exit_edges=not ablate,  # the ablation: the Eagle3 bug msched prevents
    )
    b = backend_module.MschedBackend(config, runtime_factory=runtime)
    compiled = torch.compile(model, backend=b)
    with torch.no_grad():
        compiled(*(t.clone() for t in inputs))
    return compiled


Inputs = tuple[torch.Tensor, ...]


def check(model: TinyDecoder, compiled: Callable[..., Any], inputs: Inputs) -> bool:
    """Compiled vs eager on ``inputs``; read right after the call, on the caller's stream."""
    x, buf = (t.clone() for t in inputs)
    ref_buf = torch.zeros_like(buf)
    with torch.no_grad():
        ref = model(x, ref_buf)
        out = compiled(x, buf)
        got_buf, got_out = buf.clone(), out.clone()  # enqueued on the caller's stream
    ok = True
    for name, got, want in (("output", got_out, ref), ("capture", got_buf, ref_buf)):
        diff = (got - want).abs().max().item()
        equal = torch.equal(got, want)
        print(f"  {name:8s} equal={equal} max|diff|={diff:.3g}")
        ok &= equal
    for layer in model.capture_layers:
        start, end = model.capture_slice(layer)
        same = torch.equal(got_buf[:, start:end], ref_buf[:, start:end])
        print(f"  capture of layer {layer:2d}: {'ok' if same else 'WRONG'}")
    return ok


def time_ms(fn: Callable[[], Any], repeat: int, device: str) -> float:
    """Median wall time of ``fn`` in milliseconds (CUDA events on a GPU) after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        if device == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_delayed(model: TinyDecoder, inputs: tuple[torch.Tensor, ...], args: Any) -> bool:
    what = " (ABLATION: no exit edges)" if args.ablate else ""
    print(f"{args.streams} streams, aux delay {args.delay_cycles} cycles{what}:")
    compiled = compile_model(
        model, inputs, args.streams, lambda: DelayedAuxRuntime(args.delay_cycles), args.ablate
    )
    return check(model, compiled, inputs)


def run_timed(model: TinyDecoder, inputs: tuple[torch.Tensor, ...], args: Any) -> bool:
    x, buf = (t.clone() for t in inputs)
    runs: dict[str, Callable[[], Any]] = {"eager": lambda: model(x, buf)}
    ok = True
    for streams in sorted({1, args.streams}):
        print(f"{streams} stream(s), no delay:")
        compiled = compile_model(model, inputs, streams, StreamRuntime, ablate=False)
        ok &= check(model, compiled, inputs)
        runs[f"compiled, {streams} stream(s)"] = partial(compiled, x, buf)
    print("timing:")
    with torch.no_grad():
        for name, fn in runs.items():
            ms = time_ms(fn, args.repeat, args.device)
            print(f"  {name:24s} {ms:8.3f} ms (median of {args.repeat})")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        print("gpu_streams: CUDA is not available on this machine; nothing to measure.")
        return 0
    layers = tuple(_capture_layers(args.layers))
    model = TinyDecoder(args.layers, args.hidden, layers, args.moe).to(args.device)
    inputs = tuple(t.to(args.device) for t in model.example_inputs(args.tokens, seed=7))
    device_name = torch.cuda.get_device_name() if args.device != "cpu" else "cpu"
    print(
        f"TinyDecoder: {args.layers} layers, hidden {args.hidden}, tokens {args.tokens}, "
        f"moe={args.moe}, captures {layers}, on {device_name}"
    )
    ok = run_delayed(model, inputs, args)
    if args.ablate:
        print("ablation: " + ("race exposed" if not ok else "race NOT exposed"))
        return 0 if not ok else 1
    ok &= run_timed(model, inputs, args)
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


def _capture_layers(n_layers: int) -> list[int]:
    """An early, a middle and the last layer, as Eagle3 captures them."""
    return sorted({min(1, n_layers - 1), n_layers // 2 - 1 if n_layers > 2 else 0, n_layers - 1})


if __name__ == "__main__":
    sys.exit(main())
