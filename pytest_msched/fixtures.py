"""The fixtures of pytest-msched; each wraps a plain msched function.

- ``num_streams``: the stream count of the running test (parametrized at collection, see
  `pytest_msched._params`);
- ``msched_scheduler``: the scheduler under test (``--msched-scheduler``, ini
  ``msched_scheduler``, else `msched.schedule`); a downstream ``conftest.py`` overrides it;
- ``msched_dialect``: the `msched.Dialect` of the scheduled graphs (``--msched-dialect``, ini
  ``msched_dialect``, else ``None``: detected from each graph's ops); overridable too;
- ``decoder_stack``: the factory `msched.models.decoders.decoder_stack`;
- ``schedule_graph``: `msched.testing.checks.schedule_and_verify` with ``num_streams``,
  ``msched_scheduler`` and ``msched_dialect``: the scheduler, then `msched.verify` against a
  copy of the graph made before it ran (unless verification is off), counted and kept for
  dumps by the `MschedSession`;
- ``graph_snapshot``: syrupy's ``snapshot`` with `ScheduledGraphExtension`;
- ``msched_ranks``: `msched.testing.ranks.RankPools.run`, a function on N CPU gloo ranks
  kept for the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest
from syrupy.assertion import SnapshotAssertion

from pytest_msched._params import requested_count
from pytest_msched._session import MschedSession
from pytest_msched.snapshot import ScheduledGraphExtension

# msched (and torch) are imported by the fixtures when a test uses them, not with the plugin:
# a pytest-xdist controller registers these fixtures and runs no test.
if TYPE_CHECKING:
    from torch.fx import GraphModule

    import msched
    from msched.analysis.cost import CostModel
    from msched.models.decoders import DecoderStack
    from msched.testing import checks


@pytest.fixture
def num_streams(request: pytest.FixtureRequest) -> int:
    """The stream count of this test item (``2`` in ``test[streams2]``)."""
    return requested_count(request)


@pytest.fixture(scope="session")
def msched_scheduler(pytestconfig: pytest.Config) -> checks.Scheduler:
    """The scheduler ``schedule_graph`` runs: ``scheduler(gm, num_streams) -> GraphModule |
    None`` (``None``: it rewrote ``gm`` in place).

    The function ``--msched-scheduler`` or the ini option ``msched_scheduler`` names
    (``package.module:function``), else `msched.schedule`.  Override this fixture in a
    ``conftest.py`` to test another scheduler; adapt one with other parameters with
    ``functools.partial``.
    """
    return MschedSession.of(pytestconfig).settings.scheduler


@pytest.fixture(scope="session")
def msched_dialect(pytestconfig: pytest.Config) -> msched.Dialect | None:
    """The `msched.Dialect` of the scheduled graphs' stream ops, or ``None`` to detect it
    from each graph's ops (`msched.Dialect.detect`).

    ``--msched-dialect`` or the ini option ``msched_dialect``: a built-in dialect name
    (``msched``, ``trtllm``, ``torch``, ``autodeploy``), an op namespace whose ops have
    msched's four-op shape, or
    ``package.module:attribute`` naming a Dialect.  Override this fixture in a ``conftest.py``
    to return one.
    """
    return MschedSession.of(pytestconfig).settings.dialect


@pytest.fixture(autouse=True)
def _msched_reading(request: pytest.FixtureRequest) -> Iterator[None]:
    """For the extent of every test, the helpers, snapshots and dumps read graphs in the
    dialect of its ``msched_dialect`` fixture (`pytest_msched._reading.ReadingContext`)."""
    with MschedSession.of(request.config).reading(request):
        yield


@pytest.fixture
def decoder_stack() -> Callable[..., DecoderStack]:
    """A factory of synthetic Eagle3 decoder stacks: `msched.models.decoders.decoder_stack`.

    ``decoder_stack(n_layers=6, capture_layers=(1, 3, 5), moe=False, hidden=8, tokens=4,
    seed=0, capture_op=None, tp=1, ep=1, microbatches=1, rank=None, group_name=None)``
    returns a `msched.models.decoders.DecoderStack` with a new ``.gm`` on every call;
    ``capture_op`` is an engine's own capture op (schema ``(Tensor(a!) dest, Tensor src,
    int start, int end) -> ()``; default ``msched::inplace_slice_copy``); ``tp``, ``ep``
    and ``microbatches`` build sharded stacks with functional collectives (run them on
    ranks with ``msched_ranks``).  Its nodes carry their sizes (`DecoderStack.with_sizes`),
    so the snapshot header and the summary show the schedule's memory; a stack whose sizes
    cannot be propagated (an engine's capture op without a fake implementation) has none,
    and shows none.
    """
    from msched.models.decoders import decoder_stack as build_decoder_stack

    def sized_decoder_stack(*args: Any, **kwargs: Any) -> DecoderStack:
        return _sized(build_decoder_stack(*args, **kwargs), _sizes_key(args, kwargs))

    return sized_decoder_stack


#: The sizes of the stacks built so far (node name -> ``meta["val"]``), by their arguments
#: but the seed: the weights change with it, the shapes do not, and propagating fake tensors
#: costs a tenth of a second per stack, which suites of hundreds of stacks would pay.
_STACK_SIZES: dict[Any, dict[str, Any]] = {}
_STACK_SIZES_KEPT = 64
_NO_VALUE = object()  # a node propagation gave no value (an op that returns nothing)


def _sizes_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The arguments of a stack but its seed, hashable (None: they are not)."""
    key = (args, tuple(sorted((k, v) for k, v in kwargs.items() if k != "seed")))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _sized(stack: DecoderStack, key: Any) -> DecoderStack:
    """``stack`` with its sizes (`DecoderStack.with_sizes`, or those of a stack built with
    the same arguments but the seed); a stack whose sizes cannot be propagated (an engine's
    capture op without a fake implementation) keeps none."""
    nodes = list(stack.gm.graph.nodes)
    known = _STACK_SIZES.get(key) if key is not None else None
    if known is not None and list(known) == [n.name for n in nodes]:
        for node in nodes:
            if known[node.name] is not _NO_VALUE:
                node.meta["val"] = known[node.name]
        return stack
    try:
        stack.with_sizes()
    except Exception:  # sizes are for pictures only: a stack without them still tests
        for node in nodes:
            node.meta.pop("val", None)
        return stack
    if key is not None:
        if len(_STACK_SIZES) >= _STACK_SIZES_KEPT:
            _STACK_SIZES.pop(next(iter(_STACK_SIZES)))
        _STACK_SIZES[key] = {n.name: n.meta.get("val", _NO_VALUE) for n in nodes}
    return stack


@pytest.fixture
def schedule_graph(
    request: pytest.FixtureRequest,
    num_streams: int,
    msched_scheduler: checks.Scheduler,
    msched_dialect: msched.Dialect | str | None,
) -> Callable[..., msched.Schedule]:
    """``schedule_graph(gm, cost_model=None, *, example_inputs=None) -> Schedule`` on
    ``num_streams`` streams.

    Keeps a copy of ``gm`` as the original, runs ``msched_scheduler(gm, num_streams)``,
    verifies the result (read in ``msched_dialect``) against the original and fails the test
    with the report and the lines around each violation when verification finds any
    (``--msched-verify=off`` or ``msched_verify = off`` skips verification).  A scheduler
    that raises, or returns something other than a module or None, fails the test naming it.

    With `msched.schedule` (the default) ``gm`` is rewritten in place and the result is what
    `msched.schedule` returns; with another scheduler it is the `msched.Schedule` read back
    from the graph it made (`msched.read_schedule`, under ``cost_model``).
    The graph is counted in the terminal summary and dumped by ``--msched-dump`` if the
    test fails.

    With a memory budget (``--msched-memory-budget`` or the ini option
    ``msched_memory_budget``, a ratio >= 1.0 of the original order's ``reserved_bound``)
    `msched.schedule` runs with ``memory_budget=`` and another scheduler's result fails the
    test when over it; sizes come from the graph's fake values, else from
    ``example_inputs`` (read only with a budget).
    """
    from msched.testing import checks

    session = MschedSession.of(request.config)
    nodeid = request.node.nodeid

    def schedule_graph(
        gm: GraphModule,
        cost_model: CostModel | None = None,
        *,
        example_inputs: Sequence[Any] | None = None,
    ) -> msched.Schedule:
        dialect = _checked_fixtures(msched_scheduler, msched_dialect)
        check = session.schedule_graph(
            nodeid, gm, num_streams, cost_model, msched_scheduler, dialect, example_inputs
        )
        if check.failure:
            pytest.fail(check.failure, pytrace=False)
        assert isinstance(check, checks.ScheduleCheck)
        return check.schedule

    return schedule_graph


def _checked_fixtures(scheduler: object, dialect: object) -> msched.Dialect | None:
    """The dialect of ``msched_dialect`` (a name is looked up); fail the test naming the
    fixture when ``msched_scheduler`` is not callable or ``msched_dialect`` names nothing."""
    __tracebackhide__ = True
    import msched
    from msched.proof.dialects import as_dialect

    if not callable(scheduler):
        pytest.fail(
            f"the msched_scheduler fixture returned {scheduler!r}, not a callable "
            "scheduler(gm, num_streams)",
            pytrace=False,
        )
    try:
        return None if dialect is None else as_dialect(dialect)
    except msched.InvalidArgumentError as error:
        problem = str(error)
    pytest.fail(f"the msched_dialect fixture returned {dialect!r}: {problem}", pytrace=False)


@pytest.fixture
def graph_snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """syrupy's ``snapshot`` storing scheduled graphs as ``.msched.txt`` text files.

    ``assert sched == graph_snapshot`` (or ``assert gm == graph_snapshot``).
    """
    return snapshot.use_extension(ScheduledGraphExtension)


@pytest.fixture(scope="session")
def msched_ranks() -> Iterator[Callable[..., list[Any]]]:
    """``msched_ranks(fn, *args, world_size=2, timeout=120.0, **kwargs)`` runs ``fn(rank,
    world_size, *args, **kwargs)`` on ``world_size`` CPU processes joined in one gloo group
    (127.0.0.1, a free port) and returns each rank's result in rank order.

    The ranks are a `msched.testing.ranks.RankPool` per world size, started by the first test
    that asks for them and kept for the session (one per pytest-xdist worker): many sharded
    tests pay the start of the processes (each imports torch) once.  Each call sees the test
    process's environment, working directory and ``sys.path`` of the moment, and the ranks'
    random seed, grad mode, default dtype and Dynamo caches as they were when they started
    (see `RankPool` for what a call may still find of the calls before).

    ``fn`` is a module-level function of the test module (the ranks import it).  A rank that
    raises fails the test with `msched.RankFailedError` (the rank and its traceback); ranks
    still running after ``timeout`` seconds (a collective some rank never joined) are killed
    and fail it with `msched.RanksTimeoutError`.  After either, every rank of that pool is
    killed and the next call starts new ones.  Use it under ``@pytest.mark.multistream`` to
    run a sharded schedule on every rank.
    """
    from msched.testing.ranks import RankPools

    pools = RankPools()
    try:
        yield pools.run
    finally:
        pools.close()
