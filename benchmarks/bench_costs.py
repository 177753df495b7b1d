"""Benchmark of measured costs: the one-stream makespan they predict against the forward's time.

For decoder stacks (``msched.models.decoder_stack``, MoE off) of ``--layers`` layers, and for a
tiny random ``transformers`` Llama (3 layers, exported with ``torch.export``; skipped when
``transformers`` is not installed), this prints: the graph's nodes; ``fwd_us``, the median time
of ``--repeat`` calls of the whole ``GraphModule`` (its generated code) measured in the same
run as ``msched.measure_costs``; and three one-stream makespans (``msched.simulate``,
the nodes in graph order) over it.  The forward is timed before and after ``measure_costs``;
``fwd_us`` is the median of both, and ``fwd_drift`` the median after over the median before:
how far the forward itself moves in one run, the yardstick for the ratios below:

- ``isolated``: each node timed ``--repeat`` times on its own after ``--warmup`` (how
  ``measure_costs`` timed before costs file version 2), summed;
- ``in_context``: ``measure_costs``' node medians, each node timed where the forward runs it,
  without its ``overhead_us``;
- ``predicted``: ``measure_costs``' model, with ``overhead_us`` (also printed) on every timed
  node.  ``measure_costs`` derives the overhead from forwards it times itself, so this ratio
  is close to 1 by construction; it checks that the calibration holds in another set of
  forwards.  ``from_first`` is the check that is not circular: the model measured on the
  first (smallest) stack prices each stack (by node name, then by op) against that stack's
  own forward.

``sched3/1`` is the makespan the measured model predicts for a 3-stream schedule over its
one-stream makespan.  Torch runs on one intra-op thread on CPU, as ``bench_forward.py``.  On a
CUDA device (``--device cuda``) the nodes are timed with CUDA events (device time, no overhead)
and the forward with a synchronize after each call; ``isolated`` is CPU only.  ``--cpu-time``
times with process CPU time (`time.process_time_ns`, as ``measure_costs``' ``clock``), steadier
on a shared machine, where other processes' time slices otherwise land in the long forward far
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
from torch.fx import GraphModule, Interpreter, Node

import msched
from msched.analysis.measured import Clock, _launches_work
from msched.models.decoders import decoder_stack


def forward_us(
    run: Callable[[], object], repeat: int, warmup: int, device: str, clock: Callable[[], int]
) -> list[float]:
    """Microseconds of ``repeat`` calls of ``run()`` after ``warmup`` untimed ones, by
    ``clock`` (nanoseconds)."""
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
    return samples


class Isolated(Interpreter):
    """The measurement before costs file version 2, for comparison: each node that launches
    work is called ``warmup`` times, then timed ``repeats`` times on its own; ``total`` is
    the sum of the medians in microseconds."""

    def __init__(self, gm: GraphModule, warmup: int, repeats: int, clock: Clock) -> None:
        super().__init__(gm)
        self.warmup, self.repeats, self.clock = warmup, repeats, clock
        self.total = 0.0

    def run_node(self, n: Node) -> Any:
        if not _launches_work(n):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        method = getattr(self, n.op)
        for _ in range(self.warmup):
            method(n.target, args, kwargs)
        samples = []
        for _ in range(self.repeats):
            t0 = self.clock()
            result = method(n.target, args, kwargs)
            samples.append((self.clock() - t0) / 1000.0)
        self.total += statistics.median(samples)
        return result


def without_overhead(model: msched.MeasuredCostModel) -> msched.MeasuredCostModel:
    """``model`` with ``overhead_us`` 0: the node medians alone."""
    settings = {k: getattr(model, k) for k in ("device", "device_name", "torch_version")}
    return msched.MeasuredCostModel(
        model.nodes, model.ops, warmup=model.warmup, repeats=model.repeats, **settings
    )


def compare(
    name: str,
    gm: GraphModule,
    inputs: Sequence[Any],
    args: argparse.Namespace,
    first: msched.MeasuredCostModel | None = None,
) -> tuple[dict[str, object], msched.MeasuredCostModel]:
    """One row: ``gm``'s predicted one-stream makespans against its measured forward, and
    the measured model."""
    gm.to(args.device)
    inputs = [x.to(args.device) if isinstance(x, torch.Tensor) else x for x in inputs]
    clock = time.process_time_ns if args.cpu_time else time.perf_counter_ns
    counts = dict(warmup=args.warmup, repeats=args.repeat)
    with torch.no_grad():
        before = forward_us(lambda: gm(*inputs), args.repeat, args.warmup, args.device, clock)
        model = msched.measure_costs(
            gm, inputs, **counts, clock=None if args.device != "cpu" else clock
        )
        after = forward_us(lambda: gm(*inputs), args.repeat, args.warmup, args.device, clock)
        wall = statistics.median(before + after)
        isolated = Isolated(gm, args.warmup, args.repeat, clock)
        if args.device == "cpu":
            isolated.run(*inputs)
    predicted = msched.simulate(gm, model).makespan
    three = msched.schedule(copy.deepcopy(gm), 3, cost_model=model).makespan
    row: dict[str, object] = {
        "model": name,
        "nodes": len(gm.graph.nodes),
        "fwd_us": wall,
        "fwd_drift": statistics.median(after) / statistics.median(before),
        "isolated": isolated.total / wall if args.device == "cpu" else "-",
        "in_context": msched.simulate(gm, without_overhead(model)).makespan / wall,
        "predicted": predicted / wall,
        "from_first": "-" if first is None else msched.simulate(gm, first).makespan / wall,
        "overhead_us": model.overhead_us,
        "sched3/1": three / predicted if predicted else 1.0,
    }
    return row, model


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
    first = None
    for layers in (int(n) for n in args.layers.split(",")):
        stack = decoder_stack(
            layers, capture_layers(layers), hidden=args.hidden, tokens=args.tokens
        )
        row, model = compare(f"decoder-{layers}", stack.gm, stack.example_inputs(), args, first)
        rows.append(row)
        first = first or model
    llama = tiny_llama()
    if llama is None:
        print("transformers is not installed: the Llama row is skipped")
    else:
        rows.append(compare("llama-3", *llama, args)[0])
    timed = " (process CPU time)" if args.cpu_time else ""
    title = (
        f"measured costs on {args.device}{timed}: one-stream makespans predicted / forward "
        f"measured (fwd_us), medians of {args.repeat} after {args.warmup} warm-up"
    )
    print_table(title, rows, width=11)


if __name__ == "__main__":
    main()
