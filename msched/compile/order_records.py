"""Inductor's final kernel orders kept beside its cache, so a cache hit can be verified.

Why: when Inductor serves a piece from its FX-graph or AOT cache it generates no code, so
there is no final order to read and nothing to verify.  Turning the caches off for verified
builds (what msched did first) makes every compile of a verified build cold.  Instead, each
order msched reads is written here, keyed by the SHA-256 of the output source it belongs to;
a cache hit loads the order of the source it was served and verifies it again.  A hit whose
order is missing (a cache written by another build, a deleted folder) is compiled again with
the caches off, so a verified build never runs code msched did not verify.

Healing.  The code a cold compile generates is not always the code the cache holds for the
same graph (its ``# AOT ID`` header numbers the compile in its process, and Inductor names
reused buffers differently from one process to another), so its order cannot stand for the
cached code.  Instead a hit without a usable order renews the build's generation (`renew`),
which msched's pass key covers: the piece is compiled again with the caches on, misses, and
its fresh cache entry and order are written together, so the next build is a verified hit.

A record is one JSON file ``<cache dir>/msched_orders/<sha256>.json`` holding the
`FinalOrder` without its module, and the record format's version; a record of another
version, one that does not parse, or one that does not fit the code (`matches_code`: other
stream-op calls, other streams) counts as missing.  Writes go to a temporary file that
is renamed into place, so a reader never sees half a record; a record gets the mode of any
file the process writes (``0o666`` less its umask), so a cache folder shared by several users
serves all of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from msched.compile import _inductor_internals as internals
from msched.compile._inductor_buffers import BufferLayout
from msched.compile._inductor_internals import FinalOrder, ScheduledNode

FORMAT = 2  # the version of a record; another version is never read (2: communication kernels)
_FOLDER = "msched_orders"


def record_path(code: str, directory: Path | None = None) -> Path:
    """Where the order of the output source ``code`` is kept."""
    digest = hashlib.sha256(code.encode("utf-8")).hexdigest()
    root = Path(internals.inductor_cache_dir()) if directory is None else directory
    return root / _FOLDER / f"{digest}.json"


def save_order(order: FinalOrder, directory: Path | None = None) -> Path:
    """Keep ``order`` under the hash of its code (``order.code``, which must be set)."""
    if not order.code:
        raise ValueError("an order without its output source cannot be kept")
    path = record_path(order.code, directory)
    _write_atomically(path, json.dumps(_encoded(order), sort_keys=True))
    return path


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place.  The file
    gets the mode a plain ``open(path, "w")`` would (``0o666`` less the umask), not
    ``mkstemp``'s ``0o600``: on a cache folder shared by a team or CI runners, other users
    must be able to read the records, or every hit of theirs warns and compiles again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask (read by setting it, the only portable way; the stricter value set
    for that moment never loosens a file another thread creates meanwhile)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _generation_path(key: str, directory: Path | None) -> Path:
    root = Path(internals.inductor_cache_dir()) if directory is None else directory
    return root / _FOLDER / f"generation-{key}.txt"


def generation(key: str, directory: Path | None = None) -> str:
    """The generation of the cache entries of the build with pass key ``key``: the token the
    last `renew` wrote, ``""`` when never renewed (or when it cannot be read)."""
    try:
        return _generation_path(key, directory).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def renew(key: str, directory: Path | None = None) -> str:
    """Give the build with pass key ``key`` a new generation and return it.  msched's pass
    covers it in its ``uuid()``, so every later compile of that build misses Inductor's
    caches once and writes fresh entries, with their orders: the way out of a cache entry
    msched kept no order for (an entry cannot be rewritten in place).  The generation is a
    random token, not a count: a count restarted by a deleted folder would lead back to
    entries whose orders went with that folder."""
    token = secrets.token_hex(8)
    _write_atomically(_generation_path(key, directory), token)
    return token


def load_order(code: str, directory: Path | None = None) -> FinalOrder | None:
    """The order kept for the output source ``code``, or None when there is none usable."""
    path = record_path(code, directory)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        order = _decoded(data, code)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return order if matches_code(order, code) else None


# A stream context (``with stream1:``, ``with default_stream:``) or a stream-op call
# (``torch.ops.streams.wait_event.default(2000, 1001)``) in Inductor's output code.
_CODE_STREAM_LINE = re.compile(
    r"^\s*with (?:stream(\d+)|(default_stream)):\s*$"
    r"|\btorch\.ops\.(streams\.\w+\.\w+)\(([^()]*)\)",
    re.MULTILINE,
)


_CODE_KINDS = ("kernel", "extern")  # nodes the code runs inside their stream's context


def _constants(arguments: Iterable[str]) -> tuple[int, ...]:
    """The integer arguments of a stream-op call (tensor arguments are buffer names)."""
    return tuple(int(a) for a in (a.strip() for a in arguments) if a.isdigit())


def matches_code(order: FinalOrder, code: str) -> bool:
    """Whether ``order`` can be the final order of ``code``: the code calls the same stream
    ops with the same arguments in the same order, and runs work on the same streams.  A
    cheap check against a stale or edited record, not a signature (the cache folder holds
    code that runs, so it is trusted as much as that code)."""
    calls, streams = [], set()
    for match in _CODE_STREAM_LINE.finditer(code):
        if match.group(1):
            streams.add(int(match.group(1)))
        elif match.group(3):
            calls.append((match.group(3), _constants(match.group(4).split(","))))
    expected = [
        (_op_name(n.stream_op), _constants(map(str, n.stream_args)))
        for n in order.nodes
        if n.stream_op is not None
    ]
    by_table = {index: int(name.removeprefix("stream")) for name, index in order.stream_names}
    used = {
        by_table.get(n.stream)
        for n in order.nodes
        if n.stream is not None and n.kind in _CODE_KINDS
    }
    return calls == expected and streams == used


def _encoded(order: FinalOrder) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "nodes": [_encoded_node(n) for n in order.nodes],
        "inputs": list(order.inputs),
        "outputs": list(order.outputs),
        "reuses": [list(r) for r in order.reuses],
        "stream_names": [list(s) for s in order.stream_names],
        "layouts": [
            [name, list(x.shape), list(x.stride), str(x.dtype).removeprefix("torch.")]
            for name, x in order.layouts
        ],
    }


def _encoded_node(node: ScheduledNode) -> dict[str, Any]:
    op = node.stream_op
    return {
        "name": node.name,
        "kind": node.kind,
        "stream": node.stream,
        "outputs": list(node.outputs),
        "reads": list(node.reads),
        "mutates": [list(m) for m in node.mutates],
        "origins": list(node.origins),
        "stream_op": None if op is None else _op_name(op),
        "stream_args": list(node.stream_args),
        "comm_op": node.comm_op,
        "comm_args": _plain(node.comm_args),
        "comm_kwargs": [[k, _plain(v)] for k, v in node.comm_kwargs],
        "issue": node.issue,
    }


def _plain(value: Any) -> Any:
    """A communication kernel's argument as JSON: a `Buffer` as ``{"buffer": name}``."""
    if isinstance(value, internals.Buffer):
        return {"buffer": value.name}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        return internals.Buffer(str(value["buffer"]))
    if isinstance(value, list):
        return tuple(_unplain(v) for v in value)
    return value


def _op_name(op: Any) -> str:
    """``streams.wait_event.default`` for ``torch.ops.streams.wait_event.default``."""
    return f"{op.namespace}.{op.__name__}"  # an overload's __name__ is "packet.overload"


def _op_named(name: str) -> Any:
    namespace, _, rest = name.partition(".")
    if namespace != "streams":
        raise ValueError(f"not a stream op: {name}")
    return internals.stream_op_named(rest)


def _decoded(data: dict[str, Any], code: str) -> FinalOrder:
    nodes = tuple(_decoded_node(n) for n in data["nodes"])
    return FinalOrder(
        nodes,
        tuple(data["inputs"]),
        tuple(data["outputs"]),
        reuses=tuple((old, new) for old, new in data["reuses"]),
        code=code,
        stream_names=tuple((name, index) for name, index in data["stream_names"]),
        layouts=tuple(_decoded_layouts(data.get("layouts", ()))),  # records before: none
    )


def _decoded_layouts(data: Iterable[Any]) -> Iterator[tuple[str, BufferLayout]]:
    for name, shape, stride, dtype in data:
        found = getattr(torch, dtype, None)
        if isinstance(found, torch.dtype):
            yield name, BufferLayout(tuple(shape), tuple(stride), found)


def _decoded_node(data: dict[str, Any]) -> ScheduledNode:
    op = data["stream_op"]
    return ScheduledNode(
        data["name"],
        data["kind"],
        data["stream"],
        tuple(data["outputs"]),
        tuple(data["reads"]),
        tuple((buffer, target) for buffer, target in data["mutates"]),
        tuple(data["origins"]),
        None if op is None else _op_named(op),
        tuple(data["stream_args"]),
        comm_op=str(data["comm_op"]),
        comm_args=_unplain(data["comm_args"]),
        comm_kwargs=tuple((str(k), _unplain(v)) for k, v in data["comm_kwargs"]),
        issue=data["issue"],
    )


__all__ = [
    "FORMAT",
    "generation",
    "load_order",
    "matches_code",
    "record_path",
    "renew",
    "save_order",
]
