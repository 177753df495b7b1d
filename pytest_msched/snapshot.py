"""`ScheduledGraphExtension`: syrupy snapshots of scheduled graphs, one text file each.

The snapshot of a `msched.Schedule` or a scheduled ``GraphModule`` is its canonical text
(`msched.pictures.text.render_text`), read in the Schedule's ``dialect``, in its own for a
module msched made, else in the running test's ``msched_dialect`` (none configured: detected
from its ops).  The format, the file names (``__snapshots__/<test module>/<test
name>.msched.txt``) and what a mismatch shows (`msched.pictures.diff.snapshot_summary`, then a
unified diff of the whole text in hunks with two lines of context) are specified in
``docs/text-format.md``.

Unused snapshots (`IndexedSnapshotReport`).  At the end of a run syrupy looks for snapshot
files no test used: they fail the run, and ``--snapshot-update`` deletes them.  To decide that
a file belongs to a test that ran, syrupy 7 tries every test of the same test module against
every file (``SnapshotReport._ran_items_match_location`` → ``matches_test_location``, two
``Path.resolve`` calls per pair), which is quadratic: 800 parametrized tests spend tens of
seconds in ``pytest_sessionfinish``.  While the session finishes (`indexed_snapshot_report`)
syrupy's report is `IndexedSnapshotReport`, which for files of a `ScheduledGraphExtension`
first looks up the few tests whose names could own the file (an index from test name to
tests, built once) and then asks syrupy's own ``matches_test_location`` about those only, so
the answer is syrupy's and the time is linear.  It also keeps the snapshots of tests that ran
but did not pass, or did not run at all (the session stopped early: ``-x``, ``--maxfail``,
Ctrl-C): syrupy keeps those of skipped tests only, so ``--snapshot-update`` with a test that
fails before its assertion would delete its reviewed snapshot.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

from syrupy.extensions.single_file import SingleFileSnapshotExtension
from syrupy.location import PyTestLocation
from syrupy.report import SnapshotReport
from syrupy.terminal import context_style, received_style, reset, snapshot_style

from pytest_msched._reading import plugin_hint, reading_context
from pytest_msched._syrupy_internals import (
    TEXT_WRITE_MODE,
    collected_items_by_nodeid,
    extensions_by_location,
    file_name_budget,
    provided_test_paths,
    report_class,
)

CONTEXT_LINES = 2


class ScheduledGraphExtension(SingleFileSnapshotExtension):
    """A syrupy extension: ``assert sched == snapshot.use_extension(ScheduledGraphExtension)``.

    Serializes a `msched.Schedule` or a ``torch.fx.GraphModule`` with ``render_text``; a
    ``str`` is stored as given (so a text rendered elsewhere can be compared too); a piece of
    ``msched.backend(compiler="inductor")`` (``backend.pieces[i]``) as its final kernel
    order (`_kernel_order_text`).  Anything else raises ``TypeError``.  A module is read
    back (`msched.read_schedule`) in its own dialect when msched made it (`msched.trace_streams`,
    a kernel order, `msched.schedule`), else in the running test's dialect (its
    ``msched_dialect`` fixture; none configured: detected; see
    `msched.testing.checks.resolve_dialect`) with the stream count the test asked for
    (``# streams 4`` in ``test[streams4]``); a Schedule carries both
    (`msched.read_schedule`'s ``num_streams``).
    """

    file_extension = "msched.txt"
    _write_mode = TEXT_WRITE_MODE

    def serialize(self, data: Any, **kwargs: Any) -> str:
        with plugin_hint():
            return self._text_of(data)

    def _text_of(self, data: Any) -> str:
        # msched (and torch) are imported when a test snapshots, not with the plugin: an
        # xdist controller loads this module to read its workers' reports, and runs no test.
        from torch.fx import GraphModule

        from msched import Schedule, read_schedule
        from msched.compile.pieces import Piece
        from msched.pictures.text import render_text
        from msched.testing.checks import resolve_dialect

        if isinstance(data, Schedule):
            return render_text(data)
        if isinstance(data, GraphModule):
            context = reading_context()
            configured = context.dialect() if context is not None else None
            dialect = resolve_dialect(data, configured=configured)
            requested = context.requested_streams() if context is not None else None
            return render_text(read_schedule(data, dialect=dialect, num_streams=requested))
        if isinstance(data, str):
            return data
        if isinstance(data, Piece):
            context = reading_context()
            requested = context.requested_streams() if context is not None else None
            return _kernel_order_text(data, requested)
        raise TypeError(
            f"ScheduledGraphExtension snapshots a msched.Schedule, a torch.fx.GraphModule or "
            f"a piece of msched.backend(compiler='inductor'), got {type(data).__name__}"
        )

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        """Equal texts; or a snapshot written before the header had its memory line (see
        `without_memory_line`) equal to the received text without that line, unless the run
        rewrites snapshots (``--snapshot-update`` then adds the line)."""
        if serialized_data == snapshot_data:
            return True
        if not isinstance(serialized_data, str) or not isinstance(snapshot_data, str):
            return False
        context = reading_context()
        if context is not None and context.updating_snapshots():
            return False
        old = without_memory_line(snapshot_data)
        return old == snapshot_data and without_memory_line(serialized_data) == old

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        """The schedule summary first, then hunks of ``- snapshot`` / ``+ received`` lines."""
        from msched.pictures.diff import snapshot_summary

        summary = snapshot_summary(str(snapshot_data), str(serialized_data))
        if summary:
            yield reset(context_style("schedule changes (msched diff):"))
            for line in summary:
                yield reset(context_style(f"  {line}"))
            yield reset(context_style("text changes:"))
        old = str(snapshot_data).splitlines()
        new = str(serialized_data).splitlines()
        diff = difflib.unified_diff(old, new, n=CONTEXT_LINES, lineterm="")
        for line in itertools.islice(diff, 2, None):  # skip the ---/+++ file header
            if line.startswith("@@"):
                yield reset(context_style(line))
            elif line.startswith("-"):
                yield reset(snapshot_style(f"- {line[1:]}"))
            elif line.startswith("+"):
                yield reset(received_style(f"+ {line[1:]}"))
            else:
                yield reset(context_style(f"  {line[1:]}"))


#: The header lines a memory line may follow (version, counts, times).
_HEADER_BEFORE_MEMORY = 3
_MEMORY_PREFIX = "# memory "  # msched.pictures.text.MEMORY_PREFIX, without importing torch


def without_memory_line(text: str) -> str:
    """``text`` without its header's ``# memory ...`` line (the text itself when it has
    none): users' snapshots written before msched showed memory still match."""
    lines = text.split("\n")
    head = lines[: _HEADER_BEFORE_MEMORY + 1]
    for i, line in enumerate(head):
        if line.startswith(_MEMORY_PREFIX):
            return "\n".join(lines[:i] + lines[i + 1 :])
    return text


def _kernel_order_text(piece: Any, requested: int | None) -> str:
    """The text of an Inductor-compiled piece's final kernel order: its ``kernel_order``
    program read in the ``torch`` dialect (the one it is written in, whatever the test's
    ``msched_dialect``), with the stream count the test asked for."""
    from msched import read_schedule
    from msched.pictures.text import render_text

    if piece.kernel_order is None:
        raise TypeError(
            f"piece {piece.name} has no kernel order to snapshot (compiled with "
            "compiler='fx', or served from Inductor's cache with verify=False); snapshot "
            "piece.schedule instead, or compile with compiler='inductor', verify=True"
        )
    schedule = read_schedule(piece.kernel_order, dialect="torch", num_streams=requested)
    return render_text(schedule)


# Unused snapshots ----------------------------------------------------------------------------

_KEPT_STATUSES = ("failed", "skipped", False)  # syrupy's ItemStatus values, False: not run


class _OwnerIndex:
    """The tests that could own a single-file snapshot, by the names syrupy compares.

    syrupy's ``SingleFileSnapshotExtension.matches_test_location(test, file)`` is true only
    when (a) the file's stem is the test module's basename; or the file lies in the
    directory named after the module's basename and (b) the test is not parametrized, (c) the
    file's stem is the test's parametrized name or starts with it followed by ``.`` or ``[``,
    or (d) the file's name without the extension is that name cut to syrupy's 255-character
    budget.  `candidates` returns every test meeting one of these (usually one), a superset of
    the owners; syrupy's own check then decides.
    """

    def __init__(self, tests: Iterable[PyTestLocation], extension: type[Any]) -> None:
        self.extension = extension
        self.by_stem: defaultdict[str, list[PyTestLocation]] = defaultdict(list)
        self.plain: defaultdict[str, list[PyTestLocation]] = defaultdict(list)
        self.by_name: defaultdict[tuple[str, str], list[PyTestLocation]] = defaultdict(list)
        self.by_cut: defaultdict[tuple[str, str], list[PyTestLocation]] = defaultdict(list)
        for test in tests:
            self._add(test)

    def _add(self, test: PyTestLocation) -> None:
        self.by_stem[test.basename].append(test)
        if not test.is_item_parametrized:
            self.plain[test.basename].append(test)
            return
        name = test.snapshot_name_parametrized
        self.by_name[test.basename, name].append(test)
        cut = self._cut(name)
        if cut is not None:
            self.by_cut[test.basename, cut].append(test)

    def _cut(self, name: str) -> str | None:
        """``name`` cut to the file-name budget, when syrupy cuts it."""
        sanitize, budget = file_name_budget(self.extension)
        if sanitize is None or budget is None:
            return None
        clean, limit = sanitize(name), budget()
        return clean[:limit] if 0 < limit < len(clean) else None

    def candidates(self, snapshot_location: str) -> list[PyTestLocation]:
        path = Path(snapshot_location)
        module, stem = path.parent.name, path.stem
        found = [*self.by_stem.get(stem, ()), *self.plain.get(module, ())]
        prefixes = [stem[:i] for i, c in enumerate(stem) if c in ".["]
        for name in (stem, *prefixes):
            found += self.by_name.get((module, name), ())
        suffix = f".{self.extension.file_extension}"
        if path.name.endswith(suffix):
            found += self.by_cut.get((module, path.name[: -len(suffix)]), ())
        return list(dict.fromkeys(found))


class IndexedSnapshotReport(SnapshotReport):
    """syrupy's report, matching `ScheduledGraphExtension` files to tests through an index.

    For a file that a `ScheduledGraphExtension` discovered, the three questions syrupy asks
    of every test (did a test that ran own the file; own this snapshot name; did a test that
    was kept own it) go to the tests `_OwnerIndex` finds, then to syrupy's own
    ``_matches_location``.  "Kept" is wider than syrupy's "skipped": a test that failed, was
    skipped or did not run keeps its snapshots.  Any other file gets syrupy's answers.
    """

    def _invalidate_selection_caches(self) -> None:
        super()._invalidate_selection_caches()
        for name in ("_msched_ran_owners", "_msched_kept_owners", "_msched_whole_modules"):
            self.__dict__.pop(name, None)

    @cached_property
    def _msched_ran_owners(self) -> _OwnerIndex:
        return _OwnerIndex(map(PyTestLocation, self.ran_items), ScheduledGraphExtension)

    @cached_property
    def _msched_kept_owners(self) -> _OwnerIndex:
        """The tests whose snapshots are kept: selected ones that did not pass (or run) and
        collected ones that were not selected (``-k``, ``-m``, ``--deselect``)."""
        by_id = collected_items_by_nodeid(self)
        kept = [
            nodeid
            for nodeid, status in self.selected_items.items()
            if status.value in _KEPT_STATUSES and nodeid in by_id
        ]
        kept += [nodeid for nodeid in by_id if nodeid not in self.selected_items]
        return _OwnerIndex((PyTestLocation(by_id[n]) for n in kept), ScheduledGraphExtension)

    @cached_property
    def _msched_whole_modules(self) -> set[str]:
        """The test modules (`PyTestLocation.module_path_key`) collected whole: at least one
        test was collected from the module, and no argument names a test in it (``::``)."""
        with_items = {
            PyTestLocation.module_path_key(Path(item.path)) for item in self.collected_items
        }
        by_node = {
            PyTestLocation.module_path_key(Path(path))
            for path, nodes in provided_test_paths(self).items()
            if nodes
        }
        return with_items - by_node

    def _directory_selection_allows_cleanup(self, snapshot_location: str) -> bool:
        """With test paths given, whether an unused file no test that ran owns is still
        checked: syrupy's answer (its test module is gone), or for a file of a
        `ScheduledGraphExtension`, whether its test module was collected whole."""
        if super()._directory_selection_allows_cleanup(snapshot_location):
            return True
        if not self._indexed(snapshot_location):
            return False
        modules = PyTestLocation.owning_test_modules(snapshot_location)
        keys = {PyTestLocation.module_path_key(module) for module in modules}
        return bool(keys & self._msched_whole_modules)

    def _indexed(self, snapshot_location: str) -> bool:
        """Whether the file is one whose owners the index finds."""
        extension = extensions_by_location(self).get(snapshot_location)
        return isinstance(extension, ScheduledGraphExtension) and (
            type(extension).matches_test_location.__func__  # type: ignore[attr-defined]
            is SingleFileSnapshotExtension.matches_test_location.__func__  # type: ignore[attr-defined]
        )

    def _owned(
        self, index: _OwnerIndex, snapshot_location: str, snapshot_name: str | None = None
    ) -> bool:
        return any(
            self._matches_location(test, snapshot_location)
            and (snapshot_name is None or test.matches_snapshot_name(snapshot_name))
            for test in index.candidates(snapshot_location)
        )

    def _ran_items_match_location(self, snapshot_location: str) -> bool:
        if not self._indexed(snapshot_location):
            return super()._ran_items_match_location(snapshot_location)
        return self._owned(self._msched_ran_owners, snapshot_location)

    def _ran_items_match_name(self, snapshot_location: str, snapshot_name: str) -> bool:
        if not self._indexed(snapshot_location):
            return super()._ran_items_match_name(snapshot_location, snapshot_name)
        return self._owned(self._msched_ran_owners, snapshot_location, snapshot_name)

    def _skipped_items_match_name(self, snapshot_location: str, snapshot_name: str) -> bool:
        if not self._indexed(snapshot_location):
            return super()._skipped_items_match_name(snapshot_location, snapshot_name)
        return self._owned(self._msched_kept_owners, snapshot_location, snapshot_name)


@contextlib.contextmanager
def indexed_snapshot_report() -> Iterator[None]:
    """While this runs, syrupy's session builds an `IndexedSnapshotReport` at finish.

    syrupy has no hook for its report class (`pytest_msched._syrupy_internals.report_class`).
    """
    with report_class(IndexedSnapshotReport):
        yield
