"""The table cache counts what its entries really cost (body, key, headers, spellings, the objects around
them), so its budget bounds memory; request spellings are charged to their entry, and an over-long one (a
1 MiB Accept header) is never stored."""

from __future__ import annotations

import tracemalloc

from posenc.service.tables.cache import ENTRY_OVERHEAD, SPELLING_OVERHEAD, SPELLINGS_PER_ENTRY, ByteLRUCache, CachedBody
from tests.conftest import running_client


def _entry(index: int) -> tuple[str, CachedBody]:
    """A 4-byte table as the service caches it: a digest key, its media type and validator headers."""
    key = f"{index:064x}"
    headers = (("ETag", f'"{key[:32]}"'), ("Cache-Control", "public, max-age=31536000, immutable"),
               ("X-Table-Shape", "1"))
    return key, CachedBody(body=index.to_bytes(4, "little"), media_type="application/octet-stream", headers=headers)


def test_the_count_covers_what_tiny_entries_hold() -> None:
    """The probe's 24,223 four-byte tables counted 96,892 bytes and held 27.8 MB: now the count is what is held."""
    cache = ByteLRUCache(1 << 30)
    entries = [_entry(index) for index in range(4000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for index, (key, entry) in enumerate(entries):
        cache.put(key, entry)
        cache.remember_spelling(f"/v1/alibi/slopes?alibi_bias_max={index}&format=raw&num_heads=1", key)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del entries  # (the entries' own objects were made before tracing: the count includes them, tracing does not)
    assert held <= cache.size_bytes <= 4 * held, (held, cache.size_bytes)
    assert cache.size_bytes > 4000 * (4 + 64)  # far more than bodies and keys alone


def test_spellings_go_with_their_entry() -> None:
    key, entry = _entry(1)
    cache = ByteLRUCache(entry.cost(key) + 180 * SPELLINGS_PER_ENTRY)  # no room for a second entry besides
    cache.put(key, entry)
    for index in range(2 * SPELLINGS_PER_ENTRY):
        cache.remember_spelling(f"spelling {index}", key)
    assert cache.spelling("spelling 0") == key and cache.spelling(f"spelling {SPELLINGS_PER_ENTRY}") is None
    assert cache.size_bytes <= cache.capacity
    other, second = _entry(2)
    cache.put(other, second)  # evicts the first entry, and every spelling that reached it
    assert cache.spelling("spelling 0") is None and len(cache) == 1


def test_a_flood_of_distinct_long_accept_headers_holds_nothing() -> None:
    """The probe: distinct 1 MiB `Accept: x/<junk>, */*` headers, each answered 200, grew RSS by 1.7 GB."""
    with running_client() as client:
        client.get("/v1/alibi/slopes?num_heads=8")
        cache = client.app.state.process.table_cache  # type: ignore[attr-defined]
        counted, spellings = cache.size_bytes, dict(cache._spellings)
        for index in range(20):
            accept = f"x/{index:08d}{'j' * (1 << 20)}, */*"
            assert client.get("/v1/alibi/slopes?num_heads=8", headers={"Accept": accept}).status_code == 200
        assert cache.size_bytes == counted and cache._spellings == spellings  # nothing of them was kept
        for index in range(200):  # short ones are remembered, charged to the entry, at most 64 of them
            client.get("/v1/alibi/slopes?num_heads=8", headers={"Accept": f"x/{index}, */*"})
        assert cache.size_bytes <= counted + SPELLINGS_PER_ENTRY * 300


def test_an_entrys_cost_counts_its_body_key_media_type_and_every_header() -> None:
    key, entry = _entry(7)
    strings = 64 + len("application/octet-stream") + sum(len(name) + len(value) for name, value in entry.headers)
    assert entry.cost(key) == ENTRY_OVERHEAD + 4 + strings
    assert ByteLRUCache(1 << 20).size_bytes == 0


def test_entries_and_a_spelling_that_fill_the_capacity_exactly_all_stay() -> None:
    (first, one), (second, two), (third, three) = (_entry(index) for index in range(3))
    spelled = "/v1/alibi/slopes?num_heads=1"
    cache = ByteLRUCache(one.cost(first) + two.cost(second) + SPELLING_OVERHEAD + len(spelled))
    cache.put(first, one)
    cache.put(second, two)
    cache.remember_spelling(spelled, second)
    assert len(cache) == 2 and cache.spelling(spelled) == second and cache.size_bytes == cache.capacity
    cache.put(third, three)  # no room for a third: the least recently used goes
    assert cache.peek(first) is None and cache.peek(second) is two and cache.size_bytes <= cache.capacity
    other = "/v1/alibi/slopes?num_heads=2"
    cache.remember_spelling(other, third)  # makes room by evicting the entry used least recently, never its own
    assert cache.peek(second) is None and cache.spelling(spelled) is None and cache.spelling(other) == third
    cache.remember_spelling("x" * cache.capacity, third)  # can never fit: refused, the entry stays
    assert cache.spelling("x" * cache.capacity) is None and cache.peek(third) is three
    assert cache.size_bytes <= cache.capacity


def test_an_entry_costing_the_whole_capacity_is_kept_and_a_hit_counts_once() -> None:
    key, entry = _entry(1)
    cache = ByteLRUCache(entry.cost(key))
    cache.put(key, entry)
    assert cache.get(key) is entry and cache.get("absent") is None
    assert (cache.hits, cache.misses) == (1, 1)
