"""Pictures of a scheduled graph, and the questions ``msched explain`` asks of one.

- `view` — `view_of` reads a `msched.Schedule` or a scheduled ``GraphModule`` into a `View`
  (host-order program, times, events) and answers questions about it (`joining_wait`,
  `host_index`, `event_of`, `exit_waits`, `dependencies_by_name`); every picture starts here.
- `labels` — how pictures name things: numbers, ops, op categories, streams; `naming` — the
  stable name of every record and wait (``record @add_tensor_2``, ``@entry.s0``), what the
  canonical text prints instead of event ids.
- one module per picture: `text` (canonical text, what snapshots store: its writer and its
  reader, ``# msched text format 2`` and the unversioned format 1), `json_doc` (JSON, written
  and read), `dot` (Graphviz), `trace` (Chrome / Perfetto trace events), `svg` (Gantt chart);
  `parsed` — `ParsedSchedule`, a schedule the text and JSON readers read back.
- `explain` — the text of ``msched explain``: why a node is on its stream (from the
  placement `msched.scheduling.assign` recorded), its dependencies, waits and dependents.
- `diff` — ``msched diff`` and the summary of a failing snapshot: schedules read
  back from their text or JSON (`msched.pictures.text.parse_schedule`) compared in schedule
  terms (`schedule_diff`, `snapshot_summary`).
- `demo` — the report of ``msched demo`` (its table, one layer's lanes, the captures) and
  the pictures of its ``--out``.

Every picture accepts a `msched.Schedule` or a scheduled ``GraphModule``, read in ``dialect=``
(a `msched.Dialect` or a name; by default a Schedule's own, else detected:
`view.picture_dialect`), and is deterministic: the same graph gives byte-identical output
regardless of ``PYTHONHASHSEED`` or process.
"""

from __future__ import annotations

from msched.pictures.dot import render_dot
from msched.pictures.json_doc import render_json
from msched.pictures.svg import render_svg
from msched.pictures.text import render_text
from msched.pictures.trace import render_perfetto

__all__ = [
    "render_dot",
    "render_json",
    "render_perfetto",
    "render_svg",
    "render_text",
]
