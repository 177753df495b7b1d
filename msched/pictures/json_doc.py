"""The schedule as a JSON document (``msched-schedule/1``): nodes in host order and events.

Events carry both their integer id (the graph's) and their stable name (the canonical text's,
`msched.pictures.naming`).  `render_json` writes the document, `read_json` reads it back.

Byte-identical for the same graph across runs, processes and hash seeds.
"""

from __future__ import annotations

import json
from typing import Any

from torch.fx import GraphModule

from msched.analysis.cost import CostModel
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.pictures.labels import format_number, json_number, op_label, peaks_text
from msched.pictures.parsed import ParsedSchedule, ProgramBuilder
from msched.pictures.view import EventUse, View, view_of
from msched.proof.dialects import Dialect
from msched.proof.memory import MemoryReport
from msched.proof.program import Step
from msched.proof.summary import Summary
from msched.scheduling.pipeline import Schedule

__all__ = ["FORMAT", "read_json", "render_json", "schedule_data"]

#: The ``format`` of the document: its name and version.
FORMAT = "msched-schedule/1"


def schedule_data(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> dict[str, Any]:
    """The schedule as plain data: the document `render_json` writes.

    ``nodes`` lists every action in host order (one entry per node, except a stream op that
    does several things: a switch that records and waits, ``set_stream(s, [a, b], [c])``, is
    a ``record_event`` entry per recorded event (on the old stream), a ``set_stream`` entry
    and then one ``wait_event`` entry per waited event, all with the node's name) with
    ``name``, ``op``, ``kind`` (``compute`` or the action's kind), ``stream``, ``start`` and
    ``end``, and for a stream op its ``arg``
    (the event id of a record or wait, the stream of a ``set_stream`` or ``record_stream``,
    the stream a ``wait_stream`` waits for; a ``synchronize``: the event id when it waits for
    an event, else the stream, null for the whole device);
    records, waits and a ``synchronize`` on an event also carry ``event_name``, the stable
    name the canonical text prints (``"@add_tensor_2"``; for a wait the name of the record it
    binds to, null for none).  A ``host`` entry is a stream op that does nothing on a stream.
    ``events`` lists every record with its ``event`` id, its ``name``, the ``record`` site
    and its ``waits`` (each ``{node, stream, time}``); the waits of an event that come before
    any record of it are listed with ``name`` and ``record`` null.
    ``dialect`` is the dialect of the graph's stream ops (a `msched.Dialect` or a name, as
    `msched.verify` takes it; None: a Schedule's own, else detected from the graph's ops).
    """
    v = view_of(obj, cost_model, dialect)
    return {
        "format": FORMAT,
        "streams": v.num_streams,
        "num_events": v.num_events,
        "num_waits": v.num_waits,
        "makespan": json_number(v.makespan),
        "lower_bound": json_number(v.lower_bound),
        "memory": None if v.memory is None else _memory_data(v.memory),
        "nodes": [_node_data(v, step) for step in v.program.steps],
        "events": [_event_data(v, use) for use in v.events],
    }


def _memory_data(m: MemoryReport) -> dict[str, Any]:
    """A `MemoryReport`'s figures in bytes; stream pools keyed by the stream's number as text
    (JSON keys are strings), in stream order."""
    return {
        "allocated": m.allocated,
        "reserved": m.reserved,
        "reserved_bound": m.reserved_bound,
        "baseline": m.baseline,
        "per_stream": {str(s): m.per_stream[s] for s in sorted(m.per_stream)},
        "per_stream_bound": {str(s): m.per_stream_bound[s] for s in sorted(m.per_stream_bound)},
    }


def _memory_line(doc: dict[str, Any]) -> str | None:
    """The text header's memory line of a document's ``memory`` (None: it has none, as a
    document written before the field existed)."""
    memory = doc.get("memory")
    if memory is None:
        return None
    return peaks_text(*(int(memory[key]) for key in ("allocated", "reserved", "reserved_bound")))


def _node_data(v: View, step: Step) -> dict[str, Any]:
    data = {
        "name": step.node.name,
        "op": op_label(step.node),
        "kind": step.kind,
        "stream": step.stream,
        "start": json_number(v.start[step.node]),
        "end": json_number(v.finish[step.node]),
    }
    if step.kind in ("record_event", "wait_event"):
        data["arg"] = step.event
        data["event_name"] = _event_name(v, step)
    elif step.kind in ("set_stream", "record_stream", "wait_stream"):
        data["arg"] = step.to_stream
    elif step.kind == "synchronize":  # a host barrier: on an event, a stream or the device
        data["arg"] = step.event if step.event is not None else step.to_stream
        if step.event is not None:
            data["event_name"] = _event_name(v, step)
    return data


def _site(v: View, step: Step | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {
        "node": step.node.name,
        "stream": step.stream,
        "time": json_number(v.start[step.node]),
    }


def _event_name(v: View, step: Step) -> str | None:
    """The stable name of a record, or of the record a wait binds to (None: it binds to
    none), as the canonical text prints it (`msched.pictures.naming`)."""
    if step.kind == "record_event":
        return v.names.records[step]
    return v.names.waits.get(step)


def _event_data(v: View, use: EventUse) -> dict[str, Any]:
    return {
        "event": use.event,
        "name": v.names.records[use.record] if use.record is not None else None,
        "record": _site(v, use.record),
        "waits": [_site(v, w) for w in use.waits],
    }


def render_json(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> str:
    """`schedule_data` as JSON text: two-space indent, fixed key order, trailing newline.

    Byte-identical for the same graph across runs, processes and hash seeds.  ``dialect``
    as `schedule_data` takes it.
    """
    return json.dumps(schedule_data(obj, cost_model, dialect=dialect), indent=2) + "\n"


def read_json(doc: Any, where: str = "the schedule") -> ParsedSchedule:
    """A schedule from its JSON document (`schedule_data`, parsed); ``where`` names it in
    errors.  Raises `msched.InvalidArgumentError` for any other document."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InvalidArgumentError(f"{where}: not an {FORMAT} JSON document")
    try:
        head = Summary(
            int(doc["streams"]),
            int(doc["num_events"]),
            int(doc["num_waits"]),
            _number_text(doc["makespan"]),
            _number_text(doc["lower_bound"]),
        )
        b = ProgramBuilder()
        previous: dict[str, Any] = {}
        for k, item in enumerate(doc["nodes"]):
            if _waits_in_switch(previous, item):  # the text's 'switch, wait ...' line
                b.stream_op("set_stream", int(item["stream"]), "switch", to_stream=item["stream"])
                b.text[b.steps[-1].node] = None
            _json_node(b, item, f"{where}, nodes[{k}]")
            previous = item
        memory = _memory_line(doc)
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{where}: malformed schedule JSON ({error!r})") from None
    return b.finish(head, where, memory)


def _waits_in_switch(previous: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether ``item`` is the first wait of the switch ``previous`` (one node, two entries)."""
    return (
        item["kind"] == "wait_event"
        and previous.get("kind") == "set_stream"
        and previous.get("name") == item["name"]
    )


def _json_node(b: ProgramBuilder, item: dict[str, Any], at: str) -> None:
    kind, stream, name = item["kind"], int(item["stream"]), str(item["name"])
    if kind == "compute":
        op = item["op"]
        b.compute(name, stream, op if op == "output" or op in INPUT_OPS else "call", None, at)
    elif kind == "host":
        b.host(name, stream, None, at)
    elif kind in ("record_event", "wait_event"):
        b.stream_op(kind, stream, name, 2 * int(item["arg"]))
    elif kind == "record_stream":
        to = int(item["arg"])
        b.stream_op(kind, stream, f"record_stream(?, s{to})", to_stream=to)
        b.text[b.steps[-1].node] = None
    elif kind == "wait_stream":
        b.stream_op(kind, stream, name, to_stream=int(item["arg"]))
    elif kind == "synchronize":
        _json_synchronize(b, item, stream)
    elif kind != "set_stream":
        raise ValueError(f"unknown node kind {kind!r}")


def _json_synchronize(b: ProgramBuilder, item: dict[str, Any], stream: int) -> None:
    """A host barrier: on an event (named as the text names it), a stream or the device."""
    arg = None if item["arg"] is None else int(item["arg"])
    if "event_name" in item:
        shown = item["event_name"] or f"e{arg} (unrecorded)"
        b.stream_op("synchronize", stream, f"synchronize {shown}", 2 * int(item["arg"]))
    else:
        label = "synchronize" if arg is None else f"synchronize s{arg}"
        b.stream_op("synchronize", stream, label, to_stream=arg)


def _number_text(x: Any) -> str:
    return format_number(float(x))
