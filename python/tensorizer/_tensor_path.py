"""Tensor names as paths (docs/format.md §2): flattening nested state dicts, the key tree, and rebuilding.

A path is a tuple of components, each a ``str`` (mapping key) or a non-negative ``int`` (list
index). Encoding to and from bytes is done by the C++ engine; this module only handles the
Python-side structure. No I/O here.
"""

from __future__ import annotations

import collections.abc
import json
import types
from typing import Any, Callable, Dict, Iterator, List, Mapping, Tuple, Union

PathComponent = Union[str, int]


class TensorPath(tuple):
    """A tuple of path components with the helpers the deserializer needs."""

    __slots__ = ()

    @property
    def is_str_(self) -> bool:
        return len(self) == 1 and isinstance(self[0], str)

    def normalize_(self) -> Union[str, tuple]:
        """The name as users see it: a plain ``str``, or a ``tuple`` of components."""
        return self[0] if self.is_str_ else tuple(self)

    def serialized_(self) -> bytes:
        """The on-disk name bytes (docs/format.md §2.1)."""
        if self.is_str_:
            return self[0].encode("utf-8")
        return b"\x1e" + json.dumps(list(self), ensure_ascii=True, separators=(",", ":")).encode("ascii")

    def __str__(self) -> str:
        return str(self.normalize_())

    @classmethod
    def wrap_(cls, value: Any) -> "TensorPath":
        if isinstance(value, cls):
            return value
        if isinstance(value, (tuple, list)):
            return cls(value)
        return cls((value,))


def display(path: TensorPath) -> str:
    """The name for messages: the plain string, or the JSON array."""
    if path.is_str_:
        return path[0]
    return json.dumps(list(path), ensure_ascii=False)


def _children(obj: Any) -> Iterator[Tuple[PathComponent, Any]]:
    if isinstance(obj, collections.abc.Mapping):
        for k in obj.keys():
            if not isinstance(k, str):
                raise TypeError(f"Invalid key type for state_dict: expected str, got {k.__class__.__name__!r}")
        return iter(obj.items())
    if isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (str, bytes)):
        return enumerate(obj)
    raise TypeError(f"Cannot serialize type as part of a state_dict: {obj.__class__.__name__!r}")


def flatten_structure(leaf_type: type, obj: Any) -> Iterator[Tuple[TensorPath, Any]]:
    """Depth-first (path, leaf) pairs of nested mappings (str keys) and sequences (docs/format.md §2.2)."""
    stack: List[Tuple[Tuple[PathComponent, ...], Iterator]] = [((), _children(obj))]
    while stack:
        prefix, it = stack[-1]
        for key, item in it:
            path = prefix + (key,)
            if isinstance(item, leaf_type):
                yield TensorPath(path), item
            else:
                stack.append((path, _children(item)))
                break
        else:
            stack.pop()


def build_tree(paths: List[TensorPath]) -> Dict[PathComponent, Any]:
    """The prefix tree of `paths` in first-seen order; leaves hold their full path."""
    root: Dict[PathComponent, Any] = {}
    for path in paths:
        branch = root
        for component in path[:-1]:
            branch = branch.setdefault(component, {})
        branch[path[-1]] = path
    return root


def prune_tree(tree: Dict[PathComponent, Any], keep: Callable[[TensorPath], bool]) -> None:
    """Removes leaves for which `keep` is false, and branches left empty (in place)."""
    for key in list(tree):
        value = tree[key]
        if isinstance(value, dict):
            prune_tree(value, keep)
            if not value:
                del tree[key]
        elif not keep(value):
            del tree[key]


def restructure(flat: Mapping[TensorPath, Any], use_proxies: bool = False) -> Any:
    """Rebuilds nested objects from {path: leaf} (docs/format.md §2.3).

    With `use_proxies`, every level is a read-only mapping (int keys for lists). Otherwise a
    level with int keys becomes a list ordered by index (gaps closed up), one with str keys a
    dict in first-seen order; mixing both is a ValueError.
    """
    root: Dict[PathComponent, Any] = {}
    for path, leaf in flat.items():
        branch = root
        for component in path[:-1]:
            branch = branch.setdefault(component, {})
        branch[path[-1]] = leaf

    def finish(level: Dict[PathComponent, Any]) -> Any:
        for k, v in level.items():
            if isinstance(v, dict):
                level[k] = finish(v)
        if use_proxies:
            return types.MappingProxyType(level)
        int_keys = [isinstance(k, int) for k in level]
        if any(int_keys):
            if not all(int_keys):
                raise ValueError("Invalid tensor path keys: mixes dict and list on same layer")
            return [level[k] for k in sorted(level)]
        return level

    return finish(root)
