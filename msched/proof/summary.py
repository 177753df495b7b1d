"""The schedule summary: streams, events, waits, makespan and lower bound, in one type.

Why: every picture's header, every report and the snapshot files show these five numbers of a
schedule, and each type that shows them (`msched.Schedule`, `msched.Timeline`, the pictures'
`msched.pictures.view.View`, the schedule the text and JSON readers read back) holds one
`Summary` and reads its fields through `Summarized`, so the fields and where they come from
live here once:

- a graph's summary is its timeline's (`msched.simulate`): the streams, events and waits of its
  stream program, the simulated makespan and the lower bound over its host-order dependencies;
- a graph another pass scheduled, read back (`msched.proof.scheduled.read_summary`, what
  `msched.read_schedule` returns): the stream count the pass was given, the original graph's
  lower bound;
- `msched.schedule` gives its own: the events and waits it emitted, the assignment's times;
- a schedule read back from its text or JSON keeps the times as printed (``Summary[str]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Summarized", "Summary"]

Time = TypeVar("Time", float, str)


@dataclass(frozen=True)
class Summary(Generic[Time]):
    """What a schedule's header says: ``num_streams`` streams, ``num_events`` distinct events
    recorded, ``num_waits`` waits, the ``makespan`` and the ``lower_bound`` on it, in
    cost-model units (``Summary[float]``) or as a picture printed them (``Summary[str]``)."""

    num_streams: int
    num_events: int
    num_waits: int
    makespan: Time
    lower_bound: Time


class Summarized(Generic[Time]):
    """The fields of a type's ``summary`` as attributes of its own (``sched.makespan``)."""

    summary: Summary[Time]

    @property
    def num_streams(self) -> int:
        return self.summary.num_streams

    @property
    def num_events(self) -> int:
        return self.summary.num_events

    @property
    def num_waits(self) -> int:
        return self.summary.num_waits

    @property
    def makespan(self) -> Time:
        return self.summary.makespan

    @property
    def lower_bound(self) -> Time:
        return self.summary.lower_bound
