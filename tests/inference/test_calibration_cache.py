"""The calibration cache is data, not trust (`posenc.service.inference.runtime.calibration_cache`): a file nested too
deep,
too large, with too many entries or too long a rule is measured again without an exception; a folder or file
another user made is neither read nor written, and no link planted at the temporary name is written through.

The other users are real: forked children that drop to uid 65534 (the attacker) or 65533 (a server that is not
root). The tests run as root; elsewhere those are skipped."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from posenc.service.inference.runtime import calibration_cache
from posenc.service.inference.runtime.calibration import CalibrationCache as ReExported
from posenc.service.inference.runtime.calibration_cache import (
    MAX_BYTES,
    MAX_ENTRIES,
    MAX_RULE_STEPS,
    CalibrationCache,
    file_bytes,
    nesting_depth,
    parse_entries,
    untrusted_because,
)
from tests.processes import as_user

ATTACKER, SERVER = 65534, 65533
as_root_only = pytest.mark.skipif(os.getuid() != 0, reason="another uid needs root")
FILES = ["model.onnx", "model.cpu.onnx", "model.blocked4.onnx"]
RULE = [(1, "model.onnx"), (65, "model.cpu.onnx")]
ENTRY = {"rule": [list(step) for step in RULE], "sequences": [16, 256], "ms": {"model.onnx": [0.1, 2.0]},
         "measured_at": 1.0}
PRECIOUS = "the server user's own file\n"


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    """The cache's warnings (on its logger itself: a dictConfig elsewhere may have stopped propagation)."""
    handler = _Collected()
    calibration_cache.log.addHandler(handler)
    try:
        yield handler.messages
    finally:
        calibration_cache.log.removeHandler(handler)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user may create in, like /tmp (pytest's own are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="posenc-calibration-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


def _logging_probe(action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    handler = _Collected()
    calibration_cache.log.addHandler(handler)
    return {**action(), "warnings": handler.messages}


def test_the_class_is_still_importable_from_calibration() -> None:
    assert ReExported is CalibrationCache


def test_a_rule_put_is_read_back_from_a_private_file(tmp_path: Path, warnings_logged: list[str]) -> None:
    path = tmp_path / "posenc" / "calibration.json"
    CalibrationCache(path).put("key", ENTRY)
    assert CalibrationCache(path).get("key", FILES) == RULE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert os.listdir(path.parent) == ["calibration.json"]  # no temporary file left
    CalibrationCache(path).put("other", {**ENTRY, "rule": [[1, "model.onnx"]]})
    assert set(json.loads(path.read_text())) == {"key", "other"} and not warnings_logged


def test_a_read_only_cache_reads_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rules" / "calibration.json"
    CalibrationCache(path, writable=False).put("key", ENTRY)
    assert not path.parent.exists()
    CalibrationCache(path).put("key", ENTRY)
    before = path.read_bytes()
    read_only = CalibrationCache(path, writable=False)
    read_only.put("other", ENTRY)
    assert read_only.get("key", FILES) == RULE and path.read_bytes() == before


def test_nesting_is_counted_outside_strings_only() -> None:
    assert nesting_depth('{"a": [[1, "x"]]}') == 3
    assert nesting_depth('{"[[[[[[[[[[\\"[[[[[[": "]]]]{{{{{{{{{{{{\\\\"}') == 1
    assert nesting_depth("[" * 100_000) == calibration_cache.MAX_DEPTH + 1  # stops there


def test_a_deeply_nested_file_is_measured_again_without_an_exception(tmp_path: Path,
                                                                    warnings_logged: list[str]) -> None:
    path = tmp_path / "calibration.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    for _ in range(3):  # every model reads the cache: logged once
        assert CalibrationCache(path).get("key", FILES) is None
    assert len(warnings_logged) == 1 and "nested over" in warnings_logged[0]


def test_a_file_over_the_size_bound_is_not_parsed(tmp_path: Path, warnings_logged: list[str]) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"key": ENTRY}) + " " * (2 << 20))
    assert CalibrationCache(path).get("key", FILES) is None
    assert CalibrationCache(path).get("key", FILES) is None
    assert len(warnings_logged) == 1 and f"over {MAX_BYTES} bytes" in warnings_logged[0]


@pytest.mark.parametrize("steps", [MAX_RULE_STEPS + 1, 1_000_000])
def test_a_rule_of_too_many_steps_is_measured_again_without_checking_its_steps(
        tmp_path: Path, warnings_logged: list[str], monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    path = tmp_path / "calibration.json"
    rule = ",".join(f'[{start}, "model.onnx"]' for start in range(1, steps + 1))
    path.write_text(f'{{"key": {{"rule": [{rule}], "measured_at": 1}}}}')
    checked: list[object] = []  # no step of a rule over the bound is looked at: refused by its length alone
    monkeypatch.setattr(calibration_cache, "valid_rule", lambda rule, files: checked.append(rule))
    assert CalibrationCache(path).get("key", FILES) is None
    assert CalibrationCache(path).get("key", FILES) is None
    assert checked == [] and len(warnings_logged) == 1


def test_a_rule_at_the_step_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    rule = [[start, "model.onnx"] for start in range(1, MAX_RULE_STEPS + 1)]
    path.write_text(json.dumps({"key": {"rule": rule}}))
    assert CalibrationCache(path).get("key", FILES) == [tuple(step) for step in rule]


def test_too_many_entries_are_refused_and_never_written(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({f"k{index}": ENTRY for index in range(MAX_ENTRIES + 1)}))
    assert CalibrationCache(path).get("k0", FILES) is None
    # the writer keeps the new entry and the newest others within both bounds
    many = {"new": ENTRY, **{f"k{index}": {**ENTRY, "measured_at": index} for index in range(MAX_ENTRIES + 50)}}
    kept = parse_entries(file_bytes(many))
    assert len(kept) == MAX_ENTRIES and "new" in kept and f"k{MAX_ENTRIES + 49}" in kept and "k0" not in kept
    large = {f"k{index}": {**ENTRY, "padding": "x" * 4000, "measured_at": index} for index in range(500)}
    assert len(written := file_bytes(large)) <= MAX_BYTES and "k499" in parse_entries(written)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"null", b"[]", b'{"key": [1, 2]}', b'{"key": {"rule": 5}}',
                                     b'{"key": {"rule": [[1, "model.onnx", 3]]}}', b"", b'{"key": NaN}'])
def test_odd_content_is_measured_again(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "calibration.json").write_bytes(content)
    assert CalibrationCache(tmp_path / "calibration.json").get("key", FILES) is None


def test_a_fifo_planted_as_the_cache_is_not_waited_on(tmp_path: Path, warnings_logged: list[str]) -> None:
    os.mkfifo(tmp_path / "calibration.json")
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.append(CalibrationCache(tmp_path / "calibration.json")
                                                            .get("key", FILES)), daemon=True)
    reader.start()
    reader.join(5)
    assert results == [None] and "not a regular file" in warnings_logged[0]


def test_what_may_be_trusted() -> None:
    def of(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))
    assert untrusted_because(of(stat.S_IFDIR | 0o700, 1000), (1000, 0), False) is None
    assert untrusted_because(of(stat.S_IFREG | 0o644, 0), (1000, 0), False) is None  # an administrator's file
    assert "owned by uid 1001" in str(untrusted_because(of(stat.S_IFREG | 0o600, 1001), (1000, 0), False))
    assert "writable by group" in str(untrusted_because(of(stat.S_IFDIR | 0o775, 1000), (1000,), False))
    # a ConfigMap's folder: root's, 0777, on a read-only mount
    assert untrusted_because(of(stat.S_IFDIR | 0o777, 0), (1000, 0), True) is None


@as_root_only
def test_a_link_planted_at_the_exact_temporary_name_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]) -> None:
    folder, victim = tmp_path / "posenc", tmp_path / "victim"
    folder.mkdir(mode=0o700)
    victim.write_text(PRECIOUS)
    monkeypatch.setattr(calibration_cache, "_token", lambda: "known")
    link = folder / f".calibration.json.{os.getpid()}.known"
    link.symlink_to(victim)
    for _ in range(2):
        CalibrationCache(folder / "calibration.json").put("key", ENTRY)
    assert victim.read_text() == PRECIOUS and link.is_symlink()  # not followed, and not ours to remove
    assert os.listdir(folder) == [link.name]
    assert len(warnings_logged) == 1 and "not written" in warnings_logged[0]


def _plant(folder: Path, victim: Path, pids: list[int]) -> Callable[[], dict[str, Any]]:
    """The attacker's move: make the shared cache folder first (0777), put a rule of its own there, and links to
    the victim at the temporary names of `pids` (the old `.calibration.json.<pid>`, and with the token "known")."""
    def plant() -> dict[str, Any]:
        os.mkdir(folder)
        os.chmod(folder, 0o777)
        (folder / "calibration.json").write_text(json.dumps({"key": {**ENTRY, "rule": [[1, "model.blocked4.onnx"]]}}))
        for pid in pids:
            os.symlink(victim, folder / f".calibration.json.{pid}")
            os.symlink(victim, folder / f".calibration.json.{pid}.known")
        return {}
    return plant


def _server_side(path: Path) -> dict[str, Any]:
    cache = CalibrationCache(path)
    got = [cache.get("key", FILES), CalibrationCache(path).get("key", FILES)]
    cache.put("key", ENTRY)
    return {"got": got}


@as_root_only
def test_a_folder_another_user_made_first_is_neither_read_nor_written_by_root(
        shared_tmp: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]) -> None:
    folder, victim = shared_tmp / "posenc", shared_tmp / "victim"
    victim.write_text(PRECIOUS)
    monkeypatch.setattr(calibration_cache, "_token", lambda: "known")
    as_user(ATTACKER, _plant(folder, victim, [os.getpid()]))
    planted = sorted(os.listdir(folder))
    assert _server_side(folder / "calibration.json")["got"] == [None, None]
    assert victim.read_text() == PRECIOUS and sorted(os.listdir(folder)) == planted
    assert len(warnings_logged) == 1 and f"owned by uid {ATTACKER}" in warnings_logged[0]


@as_root_only
def test_a_folder_another_user_made_first_is_neither_read_nor_written_by_a_server_user(
        shared_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, victim = shared_tmp / "posenc", shared_tmp / "victim"
    victim.write_text(PRECIOUS)
    os.chown(victim, SERVER, SERVER)
    victim.chmod(0o600)
    monkeypatch.setattr(calibration_cache, "_token", lambda: "known")
    # the server's children get pids after this one: links at the next few hundred
    as_user(ATTACKER, _plant(folder, victim, list(range(os.getpid(), os.getpid() + 300))))
    planted = sorted(os.listdir(folder))
    seen = as_user(SERVER, lambda: _logging_probe(lambda: _server_side(folder / "calibration.json")))
    assert seen["got"] == [None, None] and len(seen["warnings"]) == 1
    assert f"owned by uid {ATTACKER}" in seen["warnings"][0]
    assert victim.read_text() == PRECIOUS and sorted(os.listdir(folder)) == planted


@as_root_only
def test_a_file_another_user_owns_or_may_write_is_not_trusted(tmp_path: Path, warnings_logged: list[str]) -> None:
    path = tmp_path / "posenc" / "calibration.json"
    CalibrationCache(path).put("key", ENTRY)
    os.chown(path, ATTACKER, ATTACKER)
    assert CalibrationCache(path).get("key", FILES) is None
    os.chown(path, 0, 0)
    path.chmod(0o666)
    assert CalibrationCache(path).get("key", FILES) is None
    CalibrationCache(path).put("key", ENTRY)  # replaced by a file of ours (never written into)
    assert CalibrationCache(path).get("key", FILES) == RULE and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f"owned by uid {ATTACKER}" in warnings_logged[0]


@as_root_only
def test_a_folder_of_ours_others_may_write_is_not_used(tmp_path: Path, warnings_logged: list[str]) -> None:
    path = tmp_path / "posenc" / "calibration.json"
    CalibrationCache(path).put("key", ENTRY)
    path.parent.chmod(0o777)
    before = path.read_bytes()
    assert CalibrationCache(path).get("key", FILES) is None
    CalibrationCache(path).put("other", ENTRY)
    assert path.read_bytes() == before and len(warnings_logged) == 1 and "writable by group" in warnings_logged[0]


@as_root_only
def test_an_administrators_mounted_rules_are_read_by_the_server_user(shared_tmp: Path) -> None:
    """A Kubernetes ConfigMap: root's files behind links (calibration.json -> ..data/calibration.json)."""
    config = shared_tmp / "config"
    (config / "..2024_01_01").mkdir(parents=True)
    config.chmod(0o755)
    (config / "..2024_01_01").chmod(0o755)
    (config / "..2024_01_01" / "calibration.json").write_text(json.dumps({"key": ENTRY}))
    (config / "..2024_01_01" / "calibration.json").chmod(0o644)
    (config / "..data").symlink_to("..2024_01_01")
    (config / "calibration.json").symlink_to("..data/calibration.json")
    before = (config / "calibration.json").read_bytes()

    def read() -> dict[str, Any]:
        cache = CalibrationCache(config / "calibration.json", writable=False)
        cache.put("other", ENTRY)
        return {"got": cache.get("key", FILES)}
    seen = as_user(SERVER, lambda: _logging_probe(read))
    assert seen["got"] == [list(step) for step in RULE] and seen["warnings"] == []
    assert (config / "calibration.json").read_bytes() == before
