"""The schedule as a JSON document (``msched-schedule/1``): nodes in host order and events.

Events carry both their integer id (the graph's) and their stable name (the canonical text's,
`msched.pictures.naming`).

Byte-identical for the same graph across runs, processes and hash seeds.
"""

from __future__ import annotations

import json
from typing import Any

from torch.fx import GraphModule

from msched.analysis.cost import CostModel
from msched.pictures.labels import json_number, op_label
from msched.pictures.view import EventUse, View, view_of
from msched.proof.dialects import Step
from msched.scheduling.pipeline import Schedule

__all__ = ["render_json", "schedule_data"]


def schedule_data(
    obj: Schedule | GraphModule, cost_model: CostModel | None = None
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
    """
    v = view_of(obj, cost_model)
    return {
        "format": "msched-schedule/1",
        "streams": v.num_streams,
        "num_events": v.num_events,
        "num_waits": v.num_waits,
        "makespan": json_number(v.makespan),
        "lower_bound": json_number(v.lower_bound),
        "nodes": [_node_data(v, step) for step in v.program.steps],
        "events": [_event_data(v, use) for use in v.events],
    }


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


def render_json(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> str:
    """`schedule_data` as JSON text: two-space indent, fixed key order, trailing newline.

    Byte-identical for the same graph across runs, processes and hash seeds.
    """
    return json.dumps(schedule_data(obj, cost_model), indent=2) + "\n"
