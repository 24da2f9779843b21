"""The sweep over every rotary embedding module of the installed transformers (tests/parity/rotary_sweep.py): no text
row wrong or refused, every M-RoPE text model within the module's own float32 rounding on 3-D position ids, every
class classified, every listed reason still true, and docs/rotary-coverage.md as the sweep generates it."""

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.conftest import running_client
from tests.parity import rotary_sweep
from tests.parity.rotary_sweep import CONFIG_FIXES, EXCLUDED, Row


@pytest.fixture(scope="module")
def rows() -> Iterator[list[Row]]:
    with running_client(max_table_bytes=256 * 2**20) as client:
        assert isinstance(client, TestClient)
        yield rotary_sweep.sweep(client)


def test_every_text_and_mrope_row_is_served_exactly(rows: list[Row]) -> None:
    failing = [r for r in rows if r.kind in ("text", "mrope") and r.status not in ("exact", "ulp")]
    assert not failing, "\n".join(f"{r.folder} {r.cls} {r.layer_type}: {r.status} {r.note}" for r in failing)


def test_ulp_rows_are_inv_freq_rounding_only(rows: list[Row]) -> None:
    for r in rows:
        if r.status == "ulp":
            assert r.max_error is not None and r.max_error <= rotary_sweep.ULP, r


def test_every_config_fix_is_still_needed() -> None:
    """A default config that transformers can run and posenc serves needs no published values: its fix must go."""
    found = {r.name: r for r in rotary_sweep.rotary_classes()}
    with running_client() as client:
        for name in CONFIG_FIXES:
            assert name in found, f"{name} has a config fix but is no longer found"
            assert rotary_sweep.default_still_unfit(client, found[name]), f"{name}'s default config is fit now"


def test_every_excluded_reason_still_holds() -> None:
    found = {r.name: r for r in rotary_sweep.rotary_classes()}
    for name in EXCLUDED:
        assert name in found, f"{name} is excluded but no longer found"
        assert rotary_sweep.excluded_reason_holds(found[name]), f"{name}: {EXCLUDED[name]} no longer holds"


def test_the_coverage_table_is_the_sweeps(rows: list[Row]) -> None:
    assert rotary_sweep.COVERAGE_DOC.read_text() == rotary_sweep.coverage_markdown(rows), (
        "docs/rotary-coverage.md is stale: python -m tests.parity.rotary_sweep --write")
