"""The storage of every graph input: placeholders, ``get_attr`` nodes and module state.

- every ``get_attr`` of one attribute is one storage, and so are attributes that are one tensor
  or views of one storage (tied weights) when the owning module holds real tensors;
- placeholders are distinct storages, unless their ``node.meta["msched_storage"]`` values are
  equal (any hashable but ``None``), or the tensors in their ``node.meta["val"]`` (else
  ``meta["example_value"]``) share one storage: then they are one storage.  The piecewise
  backend labels the inputs of each piece this way, so a view and its base that cross a
  split stay one storage; downstream code can do the same for inputs it knows alias each
  other.  Dynamo gives each view of a buffer passed as an input a placeholder of its own,
  and their fake tensors keep the buffer's one storage, so those are one storage too.

Read by `msched.analysis.effects.compute_effects`, which names every other storage by the
node that makes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.fx import Graph, Node

from msched._torch_internals import storage_id
from msched.analysis.nodes import NodeList

#: The ``node.meta`` key that says which placeholders are one storage.
STORAGE_META = "msched_storage"


class InputStorages:
    """The storage of every placeholder, ``get_attr`` and module state of one graph.

    One storage per ``meta["msched_storage"]`` label, and one per tensor storage of the owning
    module (so tied attributes and views of one buffer are one storage), or per attribute
    name when the module holds no real tensors.  Module state that no ``get_attr`` names gets
    a node of its own, outside the graph, named after the attribute.
    """

    def __init__(self, graph: NodeList, by_storage: bool) -> None:
        """``by_storage``: look attributes up in the owning module (tied attributes are one
        storage); otherwise an attribute's name is its identity (cheaper, and exact as long
        as nothing writes an attribute)."""
        self.by_key: dict[Any, Node] = {}
        self.root: dict[Node, Node] = {}
        self.state: dict[str, tuple[Node, ...]] = {}
        root, by_key = self.root, self.by_key
        root.update(_placeholder_roots(_input_nodes(graph, "placeholder")))
        attributes = _input_nodes(graph, "get_attr")
        if by_storage:  # ``graph`` may be a list of another graph's nodes: ask each node
            for node in attributes:
                key = _attribute_key(node.graph.owning_module, str(node.target))
                root[node] = by_key.setdefault(key, node)
        else:  # by name, the common case: one dict entry per attribute name
            by_name: dict[Any, Node] = {}
            for node in attributes:
                root[node] = by_name.setdefault(node.target, node)

    def module_state(self, node: Node, target: str | None = None) -> tuple[Node, ...]:
        """The storages of the tensors the module ``node`` calls holds (or the module named
        ``target``; ``""`` is the owning module)."""
        target = str(node.target) if target is None else target
        found = self.state.get(target)
        if found is None:
            found = self.state[target] = self._collect_state(node, target)
        return found

    def model_state(self, node: Node) -> tuple[Node, ...]:
        """Every attribute storage of the graph and every tensor the owning module holds."""
        attributes = [r for n, r in self.root.items() if n.op == "get_attr"]
        return tuple(dict.fromkeys([*attributes, *self.module_state(node, "")]))

    def _collect_state(self, node: Node, target: str) -> tuple[Node, ...]:
        owner = node.graph.owning_module
        try:
            module = owner.get_submodule(target) if owner is not None else None
        except AttributeError:
            module = None
        if module is None:
            return ()
        roots = []
        tensors = [
            *module.named_parameters(prefix=target, remove_duplicate=False),
            *module.named_buffers(prefix=target, remove_duplicate=False),
            *_plain_tensor_attributes(module, target),
        ]
        for name, tensor in tensors:
            key = _tensor_key(tensor, name)
            if key not in self.by_key:  # state the graph never names: a node of its own
                self.by_key[key] = Node(node.graph, name, "get_attr", name, (), {})
            roots.append(self.by_key[key])
        return tuple(dict.fromkeys(roots))


def _placeholder_roots(placeholders: list[Node]) -> dict[Node, Node]:
    """The storage of every placeholder: the first placeholder of its group, where a group is
    joined by an equal ``meta["msched_storage"]`` label or by fake (or real) tensors in
    ``meta["val"]`` / ``meta["example_value"]`` that share one storage (Dynamo gives a view of
    a buffer and the buffer placeholders of their own; their fake tensors keep one storage)."""
    parent: dict[Node, Node] = {}
    first: dict[Any, Node] = {}
    position = {node: i for i, node in enumerate(placeholders)}

    def find(node: Node) -> Node:
        while node in parent:
            node = parent[node]
        return node

    for node in placeholders:
        for key in _placeholder_keys(node):
            other = first.setdefault(key, node)
            if other is not node:
                a, b = sorted((find(node), find(other)), key=position.__getitem__)
                if a is not b:  # the earlier placeholder stays the root
                    parent[b] = a
    if not parent:
        return {node: node for node in placeholders}
    return {node: find(node) for node in placeholders}


def _placeholder_keys(node: Node) -> list[Any]:
    """What ties ``node`` to other placeholders: its label and the storage of its value."""
    keys: list[Any] = []
    label = node.meta.get(STORAGE_META)
    if label is not None:
        keys.append(("label", label))
    meta = node.meta
    value = meta["val"] if "val" in meta else meta.get("example_value")
    if isinstance(value, torch.Tensor):
        storage = _storage_identity(value)
        if storage is not None:
            keys.append(("storage", storage))
    return keys


def _storage_identity(value: torch.Tensor) -> int | None:
    """An id of ``value``'s storage, equal for every tensor that lives in it (fake tensors of
    views of one buffer included; the ``meta`` that holds them keeps the storage alive, so the
    id is not reused while the graph exists), or None for tensors without a storage."""
    try:
        return storage_id(value)
    except Exception:  # sparse, nested or wrapper subclasses: no storage to compare
        return None


def _input_nodes(graph: NodeList, op: str) -> list[Node]:
    """The nodes of ``graph`` whose op is ``op`` (placeholders or attributes), in order."""
    if isinstance(graph, Graph):  # find_nodes keeps graph order
        return list(graph.find_nodes(op=op))
    return [n for n in graph.nodes if n.op == op]


# Attributes of every nn.Module that hold its registered state or its hooks, not tensors.
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "training"})


def _plain_tensor_attributes(module: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    """Tensors a module and its submodules hold outside parameters and buffers: plain
    attributes, and lists, tuples and dicts of them (``self.kv_cache = [cache]``)."""
    found: list[tuple[str, torch.Tensor]] = []
    for path, sub in module.named_modules(prefix=prefix, remove_duplicate=False):
        for attribute, value in vars(sub).items():
            if attribute not in _MODULE_INTERNALS and not attribute.endswith("hooks"):
                name = f"{path}.{attribute}" if path else attribute
                found.extend(_tensors_in(value, name, depth=3))
    return found


def _tensors_in(value: Any, name: str, depth: int) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if depth == 0:
        return []
    if isinstance(value, (list, tuple)):
        items: Iterable[tuple[Any, Any]] = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return []
    return [t for key, item in items for t in _tensors_in(item, f"{name}[{key!r}]", depth - 1)]


def _attribute_key(owner: Any, target: str) -> Any:
    """The storage an attribute of ``owner`` lives in, or its name when that is unknown."""
    value = owner
    try:
        for atom in target.split("."):
            value = getattr(value, atom)
    except AttributeError:
        return ("attribute", target)
    return _tensor_key(value, target)


def _tensor_key(value: Any, name: str) -> Any:
    """Equal for two tensors of one storage (real tensors) or one tensor object (others)."""
    if not isinstance(value, torch.Tensor):
        return ("attribute", name)
    try:
        if value.device.type != "meta":
            pointer = value.untyped_storage().data_ptr()
            if pointer:
                return ("storage", str(value.device), pointer)
    except Exception:  # fake or lazy tensors have no storage to compare: the object is the key
        pass
    return ("object", id(value))


__all__ = ["STORAGE_META", "InputStorages"]
