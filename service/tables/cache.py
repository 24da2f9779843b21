"""A byte-bounded, thread-safe LRU cache of encoded responses, and the request spellings that reach them.

Every entry is counted at what it really costs: its body, its key, its headers and media type, the
spellings that point at it (`remember_spelling`) and a fixed overhead for the Python objects around them
(measured: `ENTRY_OVERHEAD`, `SPELLING_OVERHEAD`). So `capacity` bounds the memory the cache holds, not only
its bodies: 24,000 tiny tables cost about 30 MB, and the cache budget says so.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

# Bytes of Python objects around one entry besides its strings and body (the OrderedDict slot, the
# CachedBody, the bytes/str headers, the headers tuple), and around one spelling (its dict slot and str
# header, the entry's list slot): measured with tracemalloc on CPython 3.11 (tests/api/test_cache_cost.py).
ENTRY_OVERHEAD = 1024
SPELLING_OVERHEAD = 160
SPELLINGS_PER_ENTRY = 64  # a table reached by more spellings than this is looked up the long way for the rest


@dataclass(frozen=True)
class CachedBody:
    body: bytes
    media_type: str
    headers: tuple[tuple[str, str], ...] = field(default=())

    def cost(self, key: str) -> int:
        """What this entry holds in memory, in bytes (the body, the strings, the objects around them)."""
        strings = len(key) + len(self.media_type) + sum(len(name) + len(value) for name, value in self.headers)
        return ENTRY_OVERHEAD + len(self.body) + strings


@dataclass
class _Slot:
    entry: CachedBody
    cost: int
    spellings: list[str] = field(default_factory=list)


class ByteLRUCache:
    """Least-recently-used eviction so that the cost of everything cached stays <= `capacity` bytes.

    An entry costing more than the whole capacity is not stored (it would evict everything else).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._spellings: dict[str, str] = {}  # spelling -> key of the entry it reaches
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, key: str) -> CachedBody | None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                self.misses += 1
                return None
            self._slots.move_to_end(key)
            self.hits += 1
            return slot.entry

    def peek(self, key: str) -> CachedBody | None:
        """The entry without counting a hit or a miss (the caller counts what it serves)."""
        with self._lock:
            slot = self._slots.get(key)
            return None if slot is None else slot.entry

    def count_hit(self, key: str) -> None:
        """Count a hit served from `peek` and mark the entry recently used."""
        with self._lock:
            if key in self._slots:
                self._slots.move_to_end(key)
            self.hits += 1

    def put(self, key: str, entry: CachedBody) -> None:
        cost = entry.cost(key)
        if cost > self.capacity:
            return
        with self._lock:
            old = self._slots.pop(key, None)
            if old is not None:
                self._drop(key, old)
            self._make_room(cost)
            self._slots[key] = _Slot(entry, cost)
            self._bytes += cost

    def remember_spelling(self, spelled: str, key: str) -> None:
        """Let `spelled` reach the entry `key` from now on, charged to that entry (nothing when the entry is
        not cached, already has `SPELLINGS_PER_ENTRY` spellings, or the spelling is known)."""
        cost = SPELLING_OVERHEAD + len(spelled)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or spelled in self._spellings or len(slot.spellings) >= SPELLINGS_PER_ENTRY:
                return
            self._slots.move_to_end(key)
            if self._bytes + cost > self.capacity:
                self._make_room(cost, keep=key)
                if self._bytes + cost > self.capacity:
                    return
            self._spellings[spelled] = key
            slot.spellings.append(spelled)
            slot.cost += cost
            self._bytes += cost

    def spelling(self, spelled: str) -> str | None:
        """The key a remembered spelling reaches (its entry is cached: spellings go with their entry)."""
        with self._lock:
            return self._spellings.get(spelled)

    def _make_room(self, cost: int, keep: str | None = None) -> None:
        """Evict least recently used entries (never `keep`) until `cost` more bytes fit (lock held)."""
        while self._bytes + cost > self.capacity:
            victim = next((key for key in self._slots if key != keep), None)
            if victim is None:
                return
            self._drop(victim, self._slots.pop(victim))

    def _drop(self, key: str, slot: _Slot) -> None:
        self._bytes -= slot.cost
        for spelled in slot.spellings:
            self._spellings.pop(spelled, None)
