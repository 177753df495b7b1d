"""The public surface of ``msched``: its version, and the types its functions return."""

from __future__ import annotations

import importlib
import inspect
import tomllib
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import msched

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_version_is_written_once_and_pyproject_reads_it() -> None:
    pyproject = tomllib.loads(PYPROJECT.read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    source = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "msched._version.__version__"
    assert msched.__version__ is msched._version.__version__
    assert "__version__" in msched.__all__


def _classes_in(hint: Any) -> Iterator[type]:
    """The classes a type hint names, through ``tuple[...]``, ``X | None``, ``list[...]``."""
    if isinstance(hint, type) and not typing.get_args(hint):
        yield hint
    for arg in typing.get_args(hint):
        yield from _classes_in(arg)


def _returned(fn: Callable[..., Any]) -> Iterator[type]:
    yield from _classes_in(typing.get_type_hints(fn).get("return"))


def _functions_of(name: str, value: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The exported function ``value``, or the public methods and property getters of the
    exported class ``value``, each with its dotted name."""
    if inspect.isfunction(value):
        yield name, value
    elif inspect.isclass(value):
        for attr, member in vars(value).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, property) and member.fget is not None:
                yield f"{name}.{attr}", member.fget
            elif inspect.isfunction(member):
                yield f"{name}.{attr}", member


def returned_types(module: Any) -> dict[str, set[str]]:
    """Class of msched -> the exported functions, methods and properties that return it."""
    found: dict[str, set[str]] = {}
    for name in module.__all__:
        for where, fn in _functions_of(name, getattr(module, name)):
            for cls in _returned(fn):
                if cls.__module__.split(".")[0] == "msched":
                    found.setdefault(cls.__name__, set()).add(where)
    return found


def test_every_type_an_exported_function_returns_is_exported() -> None:
    returned = returned_types(msched)
    assert {"MschedBackend", "Piece", "CompiledGraph", "Schedule", "Report"} <= set(returned)
    assert {cls: by for cls, by in returned.items() if cls not in msched.__all__} == {}


def test_the_decoder_stack_type_is_exported() -> None:
    """`msched.models.decoders.decoder_stack` (documented) returns a `msched.DecoderStack`."""
    import msched.models.decoders

    hints = typing.get_type_hints(msched.models.decoders.decoder_stack)
    assert hints["return"] is msched.DecoderStack


REMOVED_MODULES = [
    "msched.strategies",  # msched.testing.strategies
    "msched.decoder",  # msched.models.decoders
    "msched.testing.decoders",  # msched.models.decoders
    "msched.testing.reference_ops",  # msched.models.reference_ops
]


@pytest.mark.parametrize("module", REMOVED_MODULES)
def test_the_alias_modules_are_gone(module: str) -> None:
    """One public path per name (issue 35): the modules that only re-exported are removed."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_the_alias_functions_are_gone() -> None:
    """``msched.trace`` is `msched.compile_pieces`, ``render_trace`` is ``render_perfetto``:
    the old names are removed (issue 35)."""
    from msched import pictures

    assert not hasattr(msched, "trace") and not hasattr(pictures, "render_trace")
    assert "compile_pieces" in msched.__all__ and "render_perfetto" in pictures.__all__


def test_verify_takes_cuda_graph_and_the_plugin_exports_assert_capture_safe() -> None:
    import pytest_msched

    parameter = inspect.signature(msched.verify).parameters["cuda_graph"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is False
    assert "assert_capture_safe" in pytest_msched.__all__
    assert callable(pytest_msched.assert_capture_safe)


def test_peak_memory_takes_its_options_by_keyword_and_returns_a_frozen_report() -> None:
    import dataclasses

    parameters = inspect.signature(msched.peak_memory).parameters
    options = ("cost_model", "dialect", "example_inputs", "sizes")
    assert all(parameters[o].kind is inspect.Parameter.KEYWORD_ONLY for o in options)
    assert typing.get_type_hints(msched.peak_memory)["return"] is msched.MemoryReport
    assert msched.MemoryReport.__dataclass_params__.frozen
    assert dataclasses.is_dataclass(msched.MemoryReport)
    assert typing.get_type_hints(msched.Schedule.memory.func)["return"] is msched.MemoryReport


def test_schedule_takes_a_memory_budget_by_keyword_and_the_plugin_asserts_peaks() -> None:
    import pytest_msched

    parameters = inspect.signature(msched.schedule).parameters
    for name in ("memory_budget", "example_inputs"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].default is None
    assert "assert_peak_memory" in pytest_msched.__all__
    helper = inspect.signature(pytest_msched.assert_peak_memory).parameters
    assert list(helper)[:2] == ["gm_or_sched", "at_most"]


def test_costs_are_priced_by_a_table_and_measured_into_a_cost_model() -> None:
    """Issue 44: pricing particular ops (`msched.TableCostModel`) and measured costs
    (`msched.measure_costs`, returning the exported `msched.MeasuredCostModel`)."""
    for name in ("TableCostModel", "MeasuredCostModel", "measure_costs"):
        assert name in msched.__all__
    assert issubclass(msched.MeasuredCostModel, msched.TableCostModel)
    assert isinstance(msched.TableCostModel({}), msched.CostModel)
    hints = typing.get_type_hints(msched.measure_costs)
    assert hints["return"] is msched.MeasuredCostModel
    parameters = inspect.signature(msched.measure_costs).parameters
    assert list(parameters)[:2] == ["gm", "inputs"]
    for name in ("warmup", "repeats", "device", "clock"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["device"].default is None
    assert "MeasuredCostModel" in returned_types(msched)
