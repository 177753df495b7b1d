"""Every private syrupy interface of `pytest_msched._syrupy_internals` is there as relied on;
each failure names the interface and the installed syrupy."""

from __future__ import annotations

import dataclasses
import inspect
from importlib import metadata

import syrupy.session
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.report import SnapshotReport

from pytest_msched import _syrupy_internals as si
from pytest_msched.snapshot import IndexedSnapshotReport

SYRUPY = metadata.version("syrupy")


def changed(interface: str) -> str:
    return f"syrupy {SYRUPY} changed {interface}; pytest_msched.snapshot relies on it"


def test_every_report_method_has_the_parameters_relied_on() -> None:
    for name, params in si.REPORT_METHODS.items():
        method = getattr(SnapshotReport, name, None)
        assert method is not None, changed(f"SnapshotReport.{name} (gone)")
        found = tuple(inspect.signature(method).parameters)[1:]
        assert found == params, changed(f"SnapshotReport.{name}{found}")


def test_the_report_fields_read_are_fields() -> None:
    fields = {f.name for f in dataclasses.fields(SnapshotReport)}
    attributes = set(dir(SnapshotReport)) | fields
    for name in si.REPORT_FIELDS:
        assert name in attributes, changed(f"SnapshotReport.{name}")
    assert si.report_has_hooks(), changed("SnapshotReport's private methods")


def test_the_single_file_extension_has_its_write_mode_and_file_name_budget() -> None:
    assert SingleFileSnapshotExtension._write_mode is WriteMode.BINARY, changed(
        "SingleFileSnapshotExtension._write_mode"
    )
    assert si.TEXT_WRITE_MODE is WriteMode.TEXT
    sanitize, budget = si.file_name_budget(SingleFileSnapshotExtension)
    assert callable(sanitize) and isinstance(budget(), int) and budget() > 0, changed(
        "SingleFileSnapshotExtension._sanitize_filename / _max_stem_length"
    )


def test_the_session_builds_the_report_class_named_in_its_module() -> None:
    source = inspect.getsource(syrupy.session.SnapshotSession.finish)
    assert "SnapshotReport(" in source, changed("SnapshotSession.finish (builds SnapshotReport)")
    with si.report_class(IndexedSnapshotReport):
        assert syrupy.session.SnapshotReport is IndexedSnapshotReport
    assert syrupy.session.SnapshotReport is SnapshotReport
