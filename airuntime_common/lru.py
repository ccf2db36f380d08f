"""A small least-recently-used map, the one every bounded cache here uses."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A mapping that keeps at most ``max_entries`` items, dropping the least
    recently used (read or written) first. Not thread-safe; one event loop.

    Args:
        max_entries: items kept (≥ 1).

    Raises:
        ValueError: ``max_entries`` < 1.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used beyond the bound."""
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its value, or None."""
        return self._items.pop(key, None)

    def keys(self) -> list[K]:
        """The keys, least recently used first."""
        return list(self._items)

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
