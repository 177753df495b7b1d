"""``msched.backend(compiler="inductor")``: TinyDecoder (parallel MoE branches, an Eagle3
capture through a custom op with ``mutates_args``) compiled by Inductor with msched's streams.

Each compile costs Inductor's C++ build on CPU, so every configuration is compiled once per
module (fixtures) and the heavier ones are marked slow (CI runs them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import msched
import msched.compile.pieces
from msched._torch_internals import dynamo_external_objects
from msched.compile import _inductor_internals as internals
from msched.compile import inductor_backend, order_records
from msched.compile.compiler import MschedBackend
from msched.compile.kernel_order import kernel_names
from msched.compile.native_streams import CALLER, NativeStreams, stream_index
from msched.models.decoders import TinyDecoder

TOKENS, HIDDEN = 4, 16


def _model() -> TinyDecoder:
    return TinyDecoder(2, HIDDEN, (1,), moe=True)


def _compile(num_streams: int, piecewise: bool, **changes: bool):
    model = _model()
    b = msched.backend(num_streams=num_streams, compiler="inductor", piecewise=piecewise)
    if changes:
        b = MschedBackend(dataclasses.replace(b.config, **changes))
    torch._dynamo.reset()
    return model, b, torch.compile(model, backend=b)


def _run_twice(model, compiled):
    """Outputs and capture buffers of two calls, next to eager's."""
    x, cap = model.example_inputs(TOKENS)
    with torch.no_grad():
        eager_cap = cap.clone()
        eager = model(x, eager_cap)
        runs = []
        for _ in range(2):
            got_cap = torch.zeros_like(cap)
            runs.append((compiled(x, got_cap), got_cap))
    return (eager, eager_cap), runs


@pytest.fixture(scope="module", autouse=True)
def fresh_inductor_cache(tmp_path_factory):
    """Every compile here is a cold one: an earlier run's warm cache (now used by verified
    builds too) would serve these pieces without running msched's pass."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor-cache")))
        yield


CONFIGS = [
    ((2, False)),
    pytest.param((3, False), marks=pytest.mark.slow),
    pytest.param((2, True), marks=pytest.mark.slow),
    pytest.param((3, True), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=CONFIGS, ids=["s2-whole", "s3-whole", "s2-pw", "s3-pw"])
def compiled_decoder(request):
    num_streams, piecewise = request.param
    model, b, compiled = _compile(num_streams, piecewise)
    eager, runs = _run_twice(model, compiled)
    return b, eager, runs, piecewise


def test_outputs_and_capture_equal_eager_twice(compiled_decoder) -> None:
    _, (eager, eager_cap), runs, _ = compiled_decoder
    for out, cap in runs:
        torch.testing.assert_close(out, eager)
        torch.testing.assert_close(cap, eager_cap)
    assert eager_cap.abs().sum() > 0  # the capture wrote something


def test_every_piece_is_fused_verified_and_on_streams(compiled_decoder) -> None:
    b, _, _, piecewise = compiled_decoder
    pieces = b.pieces
    assert len(pieces) == (3 if piecewise else 1)  # 2 attention calls split the graph
    kernels = compute = 0
    for piece in pieces:
        assert piece.report is not None and piece.report.ok, piece.report
        assert piece.kernel_order is not None and piece.code
        kernels += len(kernel_names(piece.kernel_order))
        compute += sum(1 for n in piece.schedule.original.graph.nodes if n.op == "call_function")
    assert kernels < compute
    assert any("with stream1:" in p.code for p in pieces)
    on_streams = {
        n.meta.get("custom", {}).get("stream") for p in pieces for n in p.kernel_order.graph.nodes
    }
    assert len(on_streams) >= 2  # None (the caller's) and at least one side stream


def test_a_compiled_piece_pictures_its_kernels_on_lanes(compiled_decoder) -> None:
    from msched import pictures

    b = compiled_decoder[0]
    program = b.pieces[0].kernel_order
    lines = pictures.render_text(program).splitlines()
    assert any(line.startswith("s1 |") and "kernel(reads=" in line for line in lines)
    assert all(name in pictures.render_svg(program) for name in kernel_names(program)[:3])


@pytest.mark.slow
# Since msched schedules after Inductor's post-grad passes, no build of TinyDecoder (2 or 3
# streams, whole or piecewise) reuses a buffer across streams without the guard; the guard's
# ablation fails a real model instead (test_inductor_transformers.py, Gemma).
@pytest.mark.parametrize("ablation", ["tie_waits"])
def test_without_the_ties_or_the_reuse_guard_the_final_order_fails(ablation) -> None:
    model, _, compiled = _compile(3, False, **{ablation: False})
    x, cap = model.example_inputs(TOKENS)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as failed:
        with torch.no_grad():
            compiled(x, cap)
    inner = failed.value.inner_exception
    assert isinstance(inner, msched.PieceVerificationError)
    assert "piece graph0" in str(inner) and "`op" in str(inner)  # names the kernels


def test_an_unknown_compiler_is_refused_at_construction() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="compiler must be one of"):
        msched.backend(compiler="triton")


def test_a_cpu_piece_can_run_its_record_stream_calls() -> None:
    """``aten::record_stream`` has no CPU kernel: a CPU piece whose schedule keeps a buffer
    alive for a side stream (``streams.record_stream`` in its code) raised when it ran."""
    NativeStreams(torch.device("cpu")).install(2, 0)
    buffer = torch.zeros(2)
    assert torch.ops.streams.record_stream.default(buffer, stream_index(1)) is None


class _NormedAttention(torch.nn.Module):
    """LayerNorm, q/k/v, msched's attention op (the split op), two Linears after it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.q, self.k, self.v = (torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.up, self.gate = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        out = torch.empty_like(h)
        torch.ops.msched.attention(self.q(h), self.k(h), self.v(h), out)
        return self.up(out) * torch.sigmoid(self.gate(out)) + x


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", ["dynamic=True", "mark_dynamic"])
def test_the_pieces_of_a_dynamic_graph_compile_once_for_every_size(dynamic) -> None:
    """Pieces are compiled from Dynamo's fake inputs, symbolic sizes included.  Compiled
    from the real arguments of their first call, ``dynamic=True`` failed (LayerNorm's
    ``eps``, made an input, is read by ``.item()``, which needs Dynamo's shape environment)
    and ``mark_dynamic`` compiled every piece again for each token count."""
    torch.manual_seed(0)
    model = _NormedAttention().eval()
    b = msched.backend(num_streams=2, compiler="inductor", piecewise=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=b, dynamic=dynamic == "dynamic=True")
    with torch.no_grad():
        for tokens in (3, 5, 8):
            x = torch.randn(tokens, HIDDEN)
            if dynamic == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x))
    assert [p.name for p in b.pieces] == ["graph0.submod_0", "graph0.submod_2"]
    assert all(p.report is not None and p.report.ok for p in b.pieces)


def test_piece_inputs_are_fake_and_the_split_ops_never_run_on_real_tensors() -> None:
    """The split graph runs on fake values only: run on the real example inputs, the split
    op (a capture into a buffer) would have written the caller's buffer at compile time."""

    def program(x: torch.Tensor, capture: torch.Tensor) -> torch.Tensor:
        h = x * 2
        torch.ops.msched.inplace_slice_copy(capture, h, 0, 4)
        return h + 1

    gm = torch.fx.symbolic_trace(program)
    split = msched.compile.pieces.split_pieces(gm, ("msched::inplace_slice_copy",))
    x, capture = torch.ones(2, 4), torch.zeros(2, 8)
    inputs = inductor_backend._piece_inputs(split, [x, capture])
    assert sorted(inputs) == ["submod_0", "submod_1", "submod_2"]
    values = [v for args in inputs.values() for v in args]
    assert values and all(isinstance(v, FakeTensor) for v in values)
    assert torch.equal(capture, torch.zeros(2, 8))


@pytest.mark.slow
def test_a_piece_compiled_again_returns_what_its_graph_returns() -> None:
    """``compile_fx`` makes a graph that returns one tensor return a tuple, in place: the
    second compile of a piece (a cold compile after a cache hit) returned a list instead of
    the tensor."""
    part = torch.fx.symbolic_trace(lambda x: (x * 2).relu())
    config = msched.backend(num_streams=1, compiler="inductor").config
    for tokens in (3, 5):
        x = torch.randn(tokens, 4)
        got = inductor_backend.compile_piece("graph0.submod_0", part, [x], config, [])(x)
        assert isinstance(got, torch.Tensor) and torch.equal(got, (x * 2).relu())


def _stream_then_graph_break(x: torch.Tensor):
    side = torch.Stream(device="cpu")
    torch._dynamo.graph_break()
    return x + 1, side


def test_a_graph_that_computes_nothing_builds_and_runs() -> None:
    """A stream made before a graph break is a graph of its own that computes nothing
    (Dynamo's graph reads the stream from its table; AOT autograd drops that): Inductor
    generates no code for it, and msched compiled it twice more and raised "Inductor
    generated no code to verify", where the default backend runs it."""
    b = msched.backend(num_streams=2, compiler="inductor")
    torch._dynamo.reset()
    x = torch.randn(4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "cache served code" warning
        got, _ = torch.compile(_stream_then_graph_break, backend=b)(x)
    assert torch.equal(got, x + 1)
    nothing = [p for p in b.pieces if not p.code]
    assert nothing and all(p.report is None and p.kernel_order is None for p in nothing)


def _many_streams(x: torch.Tensor):
    made = [torch.Stream(device="cpu") for _ in range(stream_index(1) + 1)]
    return x.sin() + x.cos(), made[stream_index(1)]


def test_a_piece_leaves_the_table_entries_of_dynamos_objects_as_they_were() -> None:
    """msched's indices (1000 + stream, 2000 + event) are Dynamo's too once a frame makes
    that many streams or events: the stream the function made at index 1001 came back as
    msched's own stream 1, written over it by the piece's call."""
    b = msched.backend(num_streams=2, compiler="inductor")
    torch._dynamo.reset()
    x = torch.randn(4)
    with torch.no_grad():
        got, stream = torch.compile(_many_streams, backend=b)(x)
    assert torch.allclose(got, x.sin() + x.cos())
    assert type(stream) is torch.Stream


def test_pieces_called_from_two_threads_each_run_with_their_own_streams() -> None:
    """A call writes its streams into Dynamo's process-wide table, then runs its code: a
    call from another thread in between wrote its own, and the first piece's code ran on
    the other piece's streams."""
    inside, b_installed = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    class Announcing(NativeStreams):
        def install(self, num_streams: int, num_events: int) -> None:
            super().install(num_streams, num_events)
            b_installed.set()

    def code_a(*args):
        inside.set()
        b_installed.wait(timeout=1.0)  # B installs now, unless A's call holds the table
        seen["a"] = dynamo_external_objects()[stream_index(1)]

    def code_b(*args):
        seen["b"] = dynamo_external_objects()[stream_index(1)]

    cpu = torch.device("cpu")
    streams_a, streams_b = NativeStreams(cpu), Announcing(cpu)
    piece_a = inductor_backend.CompiledPiece(code_a, streams_a, 2, 0)
    piece_b = inductor_backend.CompiledPiece(code_b, streams_b, 2, 0)
    thread = threading.Thread(target=lambda: inside.wait(timeout=10) and piece_b())
    thread.start()
    piece_a()
    thread.join(timeout=10)
    assert seen["a"] is streams_a.stream(1)
    assert seen["b"] is streams_b.stream(1)


def test_a_piece_can_call_another_piece_from_its_code() -> None:
    """The lock is re-entrant: compiled code that calls another piece does not deadlock."""
    cpu = torch.device("cpu")
    inner = inductor_backend.CompiledPiece(lambda x: x + 1, NativeStreams(cpu), 2, 0)
    outer = inductor_backend.CompiledPiece(lambda x: inner(x) * 2, NativeStreams(cpu), 2, 0)
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(outer(1)), daemon=True)
    thread.start()
    thread.join(timeout=10)  # a lock that is not re-entrant hangs here
    assert got == [4]


def test_a_cached_piece_installs_the_events_its_stream_ops_name_only() -> None:
    """A size or stride in the code is no event index: counted as one, a piece with a
    (2, 2100) input installed 101 events before every call."""
    code = (
        "assert_size_stride(arg0_1, (2, 2100), (2100, 1))\n"
        "torch.ops.streams.record_event.default(2001, 1000)\n"
        "torch.ops.streams.wait_event.default(2001, 1001)\n"
    )
    assert inductor_backend._events_in(code, None) == 2


def test_renewing_a_build_changes_its_pass_key_only(tmp_path, monkeypatch) -> None:
    """After a hit without a kept order the build is renewed: its pass's ``uuid()`` (in
    Inductor's cache keys) changes, so the next compile misses; another build's does not."""
    monkeypatch.setattr(internals, "inductor_cache_dir", lambda: str(tmp_path))
    two = msched.backend(num_streams=2, compiler="inductor").config
    three = msched.backend(num_streams=3, compiler="inductor").config
    before = (inductor_backend._pass_key(two), inductor_backend._pass_key(three))
    order_records.renew(inductor_backend._build_key(two))
    assert inductor_backend._pass_key(two) != before[0]
    assert inductor_backend._pass_key(three) == before[1]
    assert inductor_backend._pass_key(two) == inductor_backend._pass_key(two)  # stable


def _uuid(config) -> str:
    return inductor_backend.make_pass(config, inductor_backend._PassResult()).uuid()


def test_the_pass_key_covers_mscheds_source(tmp_path, monkeypatch) -> None:
    """The key held msched's installed version only: "unknown" from a PYTHONPATH checkout,
    and the same after an edit of an editable install, so Inductor's cache could serve
    code an older msched built."""
    monkeypatch.setattr(internals, "inductor_cache_dir", lambda: str(tmp_path))
    config = msched.backend(num_streams=2, compiler="inductor").config
    before = _uuid(config)
    assert _uuid(config) == before  # the same code, the same key
    monkeypatch.setattr(inductor_backend, "_msched_source_digest", lambda: "edited")
    assert _uuid(config) != before


def test_the_source_digest_changes_with_a_files_content_or_name(tmp_path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("X = 1\n")
    (package / "notes.txt").write_text("not code")
    digest = inductor_backend.source_digest(package)
    assert inductor_backend.source_digest(package) == digest
    (package / "notes.txt").write_text("still not code")
    assert inductor_backend.source_digest(package) == digest
    (package / "sub" / "a.py").write_text("X = 2\n")
    edited = inductor_backend.source_digest(package)
    assert edited != digest
    (package / "sub" / "a.py").rename(package / "sub" / "b.py")
    assert inductor_backend.source_digest(package) not in (digest, edited)


def test_mscheds_source_digest_is_computed_once_per_process(monkeypatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(inductor_backend, "source_digest", lambda root: calls.append(root) or "d")
    inductor_backend._msched_source_digest.cache_clear()
    try:
        assert inductor_backend._msched_source_digest() == "d"
        assert inductor_backend._msched_source_digest() == "d"
        assert calls == [Path(msched.__file__).resolve().parent]
    finally:
        inductor_backend._msched_source_digest.cache_clear()


@pytest.mark.parametrize("failure", ["unwritable", "still a hit"])
def test_a_renewal_that_does_not_miss_compiles_cold(failure, monkeypatch) -> None:
    """Renewing cannot help when the generation cannot be written, or when Inductor still
    serves a hit (no order read): the piece is compiled with the caches off."""
    calls: list[bool] = []

    def compile_(gm, inputs, config, result, cold=False):
        calls.append(cold)
        return "compiled", None, "order" if cold else None

    def renew(key):
        if failure == "unwritable":
            raise OSError("read-only")
        return "token"

    monkeypatch.setattr(inductor_backend, "_compile", compile_)
    monkeypatch.setattr(inductor_backend, "renew", renew)
    config = msched.backend(num_streams=2, compiler="inductor").config
    got = inductor_backend._compile_renewed(None, [], config, inductor_backend._PassResult())
    assert got == ("compiled", None, "order")
    assert calls == ([True] if failure == "unwritable" else [False, True])


def test_an_order_that_cannot_be_kept_warns_and_the_build_goes_on(tmp_path, monkeypatch) -> None:
    """A cache folder msched cannot write (here ``msched_orders`` is a file) raised an
    ``OSError`` out of the compile although the order was verified."""
    (tmp_path / "msched_orders").write_text("not a folder")
    monkeypatch.setattr(internals, "inductor_cache_dir", lambda: str(tmp_path))
    order = internals.FinalOrder((), (), (), code="def call(args): ...")
    kept = "cannot keep Inductor.s final order in .*msched_orders"
    with pytest.warns(RuntimeWarning, match=kept):
        inductor_backend._keep(order)


CACHE_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, msched
    import torch._dynamo, torch._inductor.compile_fx, msched.compile.inductor_backend
    from msched.models.decoders import TinyDecoder


    def build(mode):
        model = TinyDecoder(2, 16, (1,), moe=True)
        x, cap = model.example_inputs(4)
        with torch.no_grad():
            if mode == "both":  # the stream-less build first, into the same cache
                torch.compile(model, backend="inductor")(x, cap.clone())
                torch._dynamo.reset()
            b = msched.backend(num_streams=2, compiler="inductor")
            try:
                out = torch.compile(model, backend=b)(x, cap)
            except Exception as failed:
                print("FAILED", type(getattr(failed, "inner_exception", failed)).__name__)
                return
        piece = b.pieces[0]
        code = piece.code
        print("STREAMS" if "with stream1:" in code and "wait_event" in code else "PLAIN")
        same = torch.allclose(out, model(x, torch.zeros_like(cap)), atol=1e-5)
        print("EQUAL" if same else "DIFF")
        print("HIT" if piece.schedule is None else "COMPILED")  # msched's pass did not run
        print("VERIFIED" if piece.report.ok and piece.kernel_order is not None else "UNVERIFIED")


    # One process imports, then forks a child per build: each child starts from what a fresh
    # process sees once it has imported (nothing compiled, no cache in memory), without
    # paying the imports again.  Its stdout and stderr go to the files the parent names.
    for line in sys.stdin:
        mode, out, err = line.split()
        pid = os.fork()
        if pid == 0:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            status = 0
            try:
                build(mode)
            except BaseException:
                import traceback
                traceback.print_exc()
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """
)


class _Builds:
    """The process that runs `CACHE_SCRIPT`'s builds, each in a child forked for it."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.count = folder, 0
        script = folder / "build.py"
        script.write_text(CACHE_SCRIPT)
        self.process = subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip

    def __call__(self, mode: str) -> list[str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.count += 1
        out, err = (self.folder / f"build{self.count}.{kind}" for kind in ("out", "err"))
        self.process.stdin.write(f"{mode} {out} {err}\n")
        self.process.stdin.flush()
        status = self.process.stdout.readline().strip()
        stderr = err.read_text() if err.exists() else "(the build process ended)"
        assert status == "0", stderr[-3000:]
        warned = ["WARNED"] if "kept no final order" in stderr else []
        return out.read_text().split() + warned

    def __enter__(self) -> _Builds:
        return self

    def __exit__(self, *failed: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        if failed[0] is not None:
            self.process.kill()
        assert self.process.wait(timeout=60) == 0 or failed[0] is not None


def _edit_records(records, edit) -> None:
    for path in records.glob("*.json"):
        data = json.loads(path.read_text())
        data["nodes"] = edit(data["nodes"])
        path.write_text(json.dumps(data))


def _without_waits(nodes):
    """A record that no longer fits its code (its event waits gone)."""
    return [n for n in nodes if n["stream_op"] != "streams.wait_event.default"]


def _consumer_before_its_wait(nodes):
    """A record that fits its code's stream ops and streams, with the first kernel that reads
    another stream's buffer moved in front of the wait that orders the read (the wait, on the
    kernel's stream, for the first event recorded after the buffer was made): a race."""
    caller = CALLER  # table index of the caller's stream (a kernel's stream None)
    made_at = {b: i for i, n in enumerate(nodes) for b in n["outputs"]}
    stream_of = {i: n["stream"] or caller for i, n in enumerate(nodes)}
    for i, node in enumerate(nodes):
        if node["kind"] != "kernel":
            continue
        for buffer in node["reads"]:
            made = made_at.get(buffer)
            if made is None or stream_of[made] == stream_of[i]:
                continue
            records = [
                n["stream_args"][0] for n in nodes[made + 1 : i]
                if n["stream_op"] == "streams.record_event.default"
                and n["stream_args"][1] == stream_of[made]
            ]  # fmt: skip
            waits = [
                j for j in range(made + 1, i)
                if nodes[j]["stream_op"] == "streams.wait_event.default"
                and nodes[j]["stream_args"][1] == stream_of[i]
                and records and nodes[j]["stream_args"][0] == records[0]
            ]  # fmt: skip
            if waits:
                wait = waits[0]
                return [*nodes[:wait], node, *nodes[wait:i], *nodes[i + 1 :]]
    raise AssertionError("no kernel reads another stream's buffer after a wait")


@pytest.mark.slow
def test_the_cache_serves_verified_stream_programs_only(tmp_path) -> None:
    """A verified build keeps Inductor's caches: a hit is verified from the final order kept
    when its code was compiled, and compiled again when no order was kept, once: under a
    renewed key, so the fresh cache entry and its order are written together."""
    cache = tmp_path / "cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    with _Builds(tmp_path, env) as build:
        verified = ["STREAMS", "EQUAL"]
        # One process with both builds: the stream-less one never serves the stream build.
        assert build("both") == [*verified, "COMPILED", "VERIFIED"]
        # A fresh process with the warm cache: served from it, with its streams, verified.
        assert build("warm") == [*verified, "HIT", "VERIFIED"]
        records = cache / "msched_orders"
        kept = {p: p.read_text() for p in records.glob("*.json")}
        _edit_records(records, _consumer_before_its_wait)  # the hit is verified from the record
        assert build("warm") == ["FAILED", "PieceVerificationError"]
        for path, text in kept.items():
            path.write_text(text)
        _edit_records(records, _without_waits)  # a record that does not fit the code is not used
        assert build("warm") == [*verified, "COMPILED", "VERIFIED", "WARNED"]
        assert build("warm") == [*verified, "HIT", "VERIFIED"]  # healed
        shutil.rmtree(records)  # no order kept for the cached code: compiled again, cold
        assert build("warm") == [*verified, "COMPILED", "VERIFIED", "WARNED"]
        assert build("warm") == [*verified, "HIT", "VERIFIED"]  # healed
