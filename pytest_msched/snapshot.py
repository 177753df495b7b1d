"""`ScheduledGraphExtension`: syrupy snapshots of scheduled graphs, one text file each.

The snapshot of a `msched.Schedule` or a scheduled ``GraphModule`` is its canonical text
(`msched.pictures.text.render_text`): a header with streams, events, waits, makespan and
lower bound,
then one line per node in emission order with its stream lane, every record and wait shown,
``output`` last.  Graphs whose stream ops are another dialect's render the same way: a
Schedule in its ``dialect`` (`msched.read_schedule`), a module in the dialect detected from
its ops (`msched.Dialect.detect`); that dialect's op names appear where ops are shown.  The
text is identical across runs, hash seeds and xdist workers, so a change in a snapshot file
is a change of the schedule, and ``git diff`` shows it line by line.

Files live next to the test module, in ``__snapshots__/<test module>/<test name>.msched.txt``
(``<test name>`` includes the parametrization, e.g. ``test_decoder[streams3]``).

A mismatch starts with a summary in schedule terms (`msched.pictures.diff.snapshot_summary`,
what ``msched diff`` prints: nodes added, removed or moved, waits and records added or
removed, counts and makespan before → after), then a unified diff of the whole text (hunks
with two lines of context): syrupy's default diff stops 100 lines after the first
difference, and the header, which changes with almost any schedule change, is the first line.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterator
from typing import Any

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.terminal import context_style, received_style, reset, snapshot_style
from torch.fx import GraphModule

from msched import Schedule
from msched.pictures.diff import snapshot_summary
from msched.pictures.text import render_text

CONTEXT_LINES = 2


class ScheduledGraphExtension(SingleFileSnapshotExtension):
    """A syrupy extension: ``assert sched == snapshot.use_extension(ScheduledGraphExtension)``.

    Serializes a `msched.Schedule` or a ``torch.fx.GraphModule`` with ``render_text``; a
    ``str`` is stored as given (so a text rendered elsewhere can be compared too).  Anything
    else raises ``TypeError``.
    """

    file_extension = "msched.txt"
    _write_mode = WriteMode.TEXT

    def serialize(self, data: Any, **kwargs: Any) -> str:
        if isinstance(data, (Schedule, GraphModule)):
            return render_text(data)
        if isinstance(data, str):
            return data
        raise TypeError(
            f"ScheduledGraphExtension snapshots a msched.Schedule or a torch.fx.GraphModule, "
            f"got {type(data).__name__}"
        )

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        """The schedule summary first, then hunks of ``- snapshot`` / ``+ received`` lines."""
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
