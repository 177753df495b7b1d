"""Benchmark of measured costs: the one-stream makespan they predict against the forward's time.

For decoder stacks (``msched.models.decoder_stack``, MoE off) of ``--layers`` layers, and for a
tiny random ``transformers`` Llama (3 layers, exported with ``torch.export``; skipped when
``transformers`` is not installed), this prints: the graph's nodes; ``predicted_us``, the
makespan of the graph on one stream (``msched.simulate``, the nodes in graph order) under
``msched.measure_costs``'s model (median of ``--repeat`` timed calls per node after
``--warmup``); ``wall_us``, the median time of ``--repeat`` calls of the whole
``GraphModule`` (its generated code) measured in the same run; their ratio; and
``sched3/1``, the makespan the measured model predicts for a 3-stream schedule over its
one-stream makespan.

A ratio below 1 is the host time between nodes that no node's time includes (the generated
code's Python, freeing tensors); above 1, time a node pays alone that it shares in a forward
(caches warm from the node before).  Torch runs on one intra-op thread on CPU, as
``bench_forward.py``.  On a CUDA device (``--device cuda``) the nodes are timed with CUDA
events and the forward with a synchronize after each call.  ``--cpu-time`` times both with
process CPU time (`time.process_time_ns`, as ``measure_costs``' ``clock``), steadier on a
shared machine, where other processes' time slices otherwise land in the long forward far
more often than in one short node.

Run: ``python benchmarks/bench_costs.py [--layers 2,6,12] [--hidden 256] [--tokens 64]
[--repeat 10] [--warmup 3] [--device cpu] [--cpu-time]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from bench_schedule import capture_layers, print_table
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack


def forward_us(
    run: Callable[[], object], repeat: int, warmup: int, device: str, clock: Callable[[], int]
) -> float:
    """Median microseconds of one ``run()`` after ``warmup`` untimed calls, by ``clock``
    (nanoseconds)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    samples = []
    for _ in range(repeat):
        t0 = clock()
        run()
        sync()
        samples.append((clock() - t0) / 1000.0)
    return statistics.median(samples)


def compare(
    name: str, gm: GraphModule, inputs: Sequence[Any], args: argparse.Namespace
) -> dict[str, object]:
    """One row: ``gm``'s predicted one-stream makespan against its measured forward."""
    gm.to(args.device)
    inputs = [x.to(args.device) if isinstance(x, torch.Tensor) else x for x in inputs]
    clock = time.process_time_ns if args.cpu_time else time.perf_counter_ns
    counts = dict(warmup=args.warmup, repeats=args.repeat)
    with torch.no_grad():
        model = msched.measure_costs(
            gm, inputs, **counts, clock=None if args.device != "cpu" else clock
        )
        wall = forward_us(lambda: gm(*inputs), args.repeat, args.warmup, args.device, clock)
    predicted = msched.simulate(gm, model).makespan
    three = msched.schedule(copy.deepcopy(gm), 3, cost_model=model).makespan
    return {
        "model": name,
        "nodes": len(gm.graph.nodes),
        "predicted_us": predicted,
        "wall_us": wall,
        "predicted/wall": predicted / wall,
        "sched3/1": three / predicted if predicted else 1.0,
    }


def tiny_llama() -> tuple[GraphModule, list[torch.Tensor]] | None:
    """A random 3-layer Llama (hidden 32) exported with ``torch.export``, and its input ids;
    None without ``transformers``."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=ids, use_cache=False).logits

    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gm = torch.export.export(Logits(), (ids,)).module()
    assert isinstance(gm, GraphModule)
    return gm, [ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,6,12")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cpu-time", action="store_true", help="time process CPU time")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    rows = []
    for layers in (int(n) for n in args.layers.split(",")):
        stack = decoder_stack(
            layers, capture_layers(layers), hidden=args.hidden, tokens=args.tokens
        )
        rows.append(compare(f"decoder-{layers}", stack.gm, stack.example_inputs(), args))
    llama = tiny_llama()
    if llama is None:
        print("transformers is not installed: the Llama row is skipped")
    else:
        rows.append(compare("llama-3", *llama, args))
    timed = " (process CPU time)" if args.cpu_time else ""
    title = (
        f"measured costs on {args.device}{timed}: one-stream makespan predicted / forward "
        f"measured, median of {args.repeat} after {args.warmup} warm-up"
    )
    print_table(title, rows, width=15)


if __name__ == "__main__":
    main()
