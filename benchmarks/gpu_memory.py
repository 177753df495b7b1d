"""`msched.peak_memory` against what CUDA's caching allocator measures, 1-3 streams.

Prepared for a machine with a GPU (none was lent when it was written; it has not run there).
For the dense and the MoE decoder (``--layers``, ``--hidden``, ``--tokens``) on each stream
count of ``--streams``, three ways of running it:

- ``graph``: `msched.models.decoders.decoder_stack`, scheduled by `msched.schedule` (sizes
  propagated from its example inputs) and the scheduled FX module called directly;
- ``fx``: `TinyDecoder` under ``torch.compile(backend=msched.backend(num_streams=k))``; the
  model is `msched.peak_memory` of each piece's scheduled module (``piece.gm``);
- ``inductor``: the same with ``compiler="inductor"``; the model is `msched.peak_memory` of
  each piece's ``kernel_order`` (the code Inductor runs, its buffer reuse included).

Each is run once to compile and warm up; then, with the inputs and weights on the device,
``torch.cuda.synchronize()``, ``empty_cache()`` and ``reset_peak_memory_stats()``, one
forward, and ``max_memory_allocated()`` / ``max_memory_reserved()`` minus what was allocated
/ reserved before it (the inputs and weights: the model's ``baseline``).  The table puts them
next to the model's ``allocated``, ``reserved`` and ``reserved_bound`` (MiB; the largest over
the pieces when Dynamo made several) with the ratios measured/model: ``alloc/model`` should
be 1.00 up to what Inductor allocates inside kernels; ``reserved`` is the model of a device
that keeps up with `msched.simulate`'s timeline, ``reserved_bound`` the most under any
timing, so ``res/bound`` should be at most 1.

The tensor- and expert-parallel stacks (``tp``, ``ep``, two micro-batches) are skipped: their
graphs are built for rank 0 of 2 and a 1-rank group would run another graph than the one
modeled; run them under ``torchrun`` when a multi-GPU machine is lent.

On a machine without CUDA it prints one line saying so and exits 0 (nothing to measure).
Run: ``python benchmarks/gpu_memory.py [--streams 1,2,3] [--layers 6] [--hidden 1024]
[--tokens 512] [--graphs dense,moe] [--ways graph,fx,inductor]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

import msched
from msched.models.decoders import TinyDecoder, decoder_stack

MIB = 1024 * 1024
GRAPHS = ("dense", "moe")
WAYS = ("graph", "fx", "inductor")
HEADER = [
    "graph", "streams", "way", "pieces", "alloc", "model", "alloc/model",
    "reserved", "model", "bound", "res/model", "res/bound",
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,3", help="stream counts, comma-separated")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--graphs", default=",".join(GRAPHS), help="dense,moe")
    parser.add_argument("--ways", default=",".join(WAYS), help="graph,fx,inductor")
    return parser


def measure(call: Callable[[], Any]) -> tuple[int, int]:
    """Peak allocated and reserved bytes of one ``call`` above what was held before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - allocated
    held = torch.cuda.max_memory_reserved() - reserved
    del out
    return peak, held


def largest(reports: list[msched.MemoryReport]) -> tuple[int, int, int]:
    """The model's three figures, the largest over the pieces (they run one after another)."""
    return (
        max(r.allocated for r in reports),
        max(r.reserved for r in reports),
        max(r.reserved_bound for r in reports),
    )


def run_graph(name: str, streams: int, args: argparse.Namespace) -> tuple[Any, ...]:
    """The scheduled decoder stack, called directly: measured and modeled."""
    stack = decoder_stack(
        n_layers=args.layers,
        capture_layers=(1, args.layers - 1),
        moe=name == "moe",
        hidden=args.hidden,
        tokens=args.tokens,
    )
    inputs = stack.example_inputs()
    sched = msched.schedule(stack.gm, streams, example_inputs=inputs)
    report = msched.peak_memory(sched.gm, example_inputs=inputs)
    gm = sched.gm.cuda()
    x, dest = (t.cuda() for t in inputs)
    gm(x, dest)  # warm-up: streams and events made once
    return (1, *measure(lambda: gm(x, dest)), *largest([report]))


def run_compiled(name: str, streams: int, way: str, args: argparse.Namespace) -> tuple[Any, ...]:
    """`TinyDecoder` under msched's backend with compiler ``way``: measured and modeled."""
    model = TinyDecoder(args.layers, args.hidden, (1, args.layers - 1), moe=name == "moe").cuda()
    x, cap = (t.cuda() for t in model.example_inputs(args.tokens))
    torch._dynamo.reset()
    backend = msched.backend(num_streams=streams, compiler=way)
    compiled = torch.compile(model, backend=backend)
    compiled(x, cap)  # compiles and warms up
    peak, held = measure(lambda: compiled(x, cap))
    graphs = [p.gm if way == "fx" else p.kernel_order for p in backend.pieces]
    reports = [msched.peak_memory(g) for g in graphs if g is not None]
    return (len(reports), peak, held, *largest(reports))


def row(name: str, streams: int, way: str, figures: tuple[Any, ...]) -> str:
    pieces, peak, held, allocated, reserved, bound = figures

    def ratio(a: int, b: int) -> str:
        return f"{a / b:.2f}" if b else "-"

    cells = [name, str(streams), way, str(pieces)]
    cells += [f"{peak / MIB:.2f}", f"{allocated / MIB:.2f}", ratio(peak, allocated)]
    cells += [f"{held / MIB:.2f}", f"{reserved / MIB:.2f}", f"{bound / MIB:.2f}"]
    cells += [ratio(held, reserved), ratio(held, bound)]
    return "".join(f"{c:>12}" for c in cells)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_memory.py needs a CUDA device: torch.cuda.is_available() is False")
        return 0
    counts = [int(s) for s in args.streams.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; MiB above the inputs")
    print("".join(f"{h:>12}" for h in HEADER))
    with torch.no_grad():
        for name in args.graphs.split(","):
            for k in counts:
                for way in args.ways.split(","):
                    if way == "graph":
                        figures = run_graph(name, k, args)
                    else:
                        figures = run_compiled(name, k, way, args)
                    print(row(name, k, way, figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
