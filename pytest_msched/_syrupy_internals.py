"""Every private syrupy interface the plugin uses, and the syrupy versions it is tested with.

`pytest_msched.snapshot` needs what syrupy keeps private: the text write mode of a
single-file extension, the file-name budget of its ``matches_test_location``, and the
private methods of ``SnapshotReport`` that `IndexedSnapshotReport` overrides (syrupy has no
hook for its report class, so `report_class` swaps the name ``syrupy.session`` looks up).
Each is named here; ``tests/plugin/test_syrupy_internals.py`` checks each against the
installed syrupy and names the one that changed.  Outside ``SYRUPY_TESTED`` the plugin warns
at start-up (`pytest_msched._pytest_internals.untested_versions`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import syrupy.session
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.report import SnapshotReport

#: The syrupy releases the plugin is tested with: at least the first, below the second.
SYRUPY_TESTED = ("7.0.2", "7.1")

#: The text write mode, set as a single-file extension's ``_write_mode``.
TEXT_WRITE_MODE = WriteMode.TEXT

#: The private methods of ``SnapshotReport`` `IndexedSnapshotReport` calls or overrides,
#: with the parameters it relies on (after ``self``).
REPORT_METHODS: dict[str, tuple[str, ...]] = {
    "_matches_location": ("location", "snapshot_location"),
    "_invalidate_selection_caches": (),
    "_ran_items_match_location": ("snapshot_location",),
    "_ran_items_match_name": ("snapshot_location", "snapshot_name"),
    "_skipped_items_match_name": ("snapshot_location", "snapshot_name"),
    "_directory_selection_allows_cleanup": ("snapshot_location",),
}
#: The private fields of a ``SnapshotReport`` it reads.
REPORT_FIELDS = ("_extensions", "_collected_items_by_nodeid", "_provided_test_paths")


def report_has_hooks() -> bool:
    """Whether this syrupy's ``SnapshotReport`` has every method and field relied on."""
    fields = getattr(SnapshotReport, "__dataclass_fields__", {})
    methods = all(hasattr(SnapshotReport, m) for m in REPORT_METHODS)
    return methods and "_extensions" in fields


def extensions_by_location(report: SnapshotReport) -> dict[str, Any]:
    """The extension that discovered each snapshot file (``SnapshotReport._extensions``)."""
    return report._extensions


def provided_test_paths(report: SnapshotReport) -> dict[str, Any]:
    """The test paths given on the command line, each with the node ids it names
    (``SnapshotReport._provided_test_paths``)."""
    return report._provided_test_paths


def collected_items_by_nodeid(report: SnapshotReport) -> dict[str, Any]:
    """The collected test items by node id (``SnapshotReport._collected_items_by_nodeid``)."""
    return report._collected_items_by_nodeid


def file_name_budget(extension: type[SingleFileSnapshotExtension]) -> tuple[Any, Any]:
    """The extension's file-name sanitizer and stem budget (None each where syrupy has none)."""
    return (
        getattr(extension, "_sanitize_filename", None),
        getattr(extension, "_max_stem_length", None),
    )


@contextlib.contextmanager
def report_class(cls: type[SnapshotReport]) -> Iterator[None]:
    """While this runs, syrupy's session builds a ``cls`` report at finish.

    ``SnapshotSession.finish`` looks up the name ``SnapshotReport`` in ``syrupy.session`` when
    it runs; the name is put back after.  Nothing changes for a syrupy without the methods
    the report overrides (`report_has_hooks`).
    """
    original = getattr(syrupy.session, "SnapshotReport", None)
    if original is not SnapshotReport or not report_has_hooks():
        yield
        return
    syrupy.session.SnapshotReport = cls  # type: ignore[misc]
    try:
        yield
    finally:
        syrupy.session.SnapshotReport = original  # type: ignore[misc]
