"""A byte-bounded, thread-safe LRU cache of encoded responses."""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CachedBody:
    body: bytes
    media_type: str
    headers: tuple[tuple[str, str], ...] = field(default=())


class ByteLRUCache:
    """Least-recently-used eviction so that the sum of cached body sizes stays <= `capacity` bytes.

    An entry larger than the whole capacity is not stored (it would evict everything else).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, CachedBody] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedBody | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def peek(self, key: str) -> CachedBody | None:
        """The entry without counting a hit or a miss (the caller counts what it serves)."""
        with self._lock:
            return self._entries.get(key)

    def count_hit(self, key: str) -> None:
        """Count a hit served from `peek` and mark the entry recently used."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            self.hits += 1

    def put(self, key: str, entry: CachedBody) -> None:
        size = len(entry.body)
        if size > self.capacity:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.body)
            while self._entries and self._bytes + size > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted.body)
            self._entries[key] = entry
            self._bytes += size
