"""The container's lock files: complete, pinned with hashes, within pyproject's ranges and not stale."""

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from lock import DIGEST_PREFIX, FLAVOURS, requirements_digest  # noqa: E402
from runtime_requirements import lock_path, runtime_requirements  # noqa: E402

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def pins(text: str) -> dict[str, list[str]]:
    """Package name -> the versions pinned for it (a universal lock may pin one per platform marker)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if match := PIN.match(line):
            found.setdefault(canonicalize_name(match.group(1)), []).append(match.group(2))
    return found


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_lock_is_resolved_from_the_current_pyproject(flavour: str) -> None:
    text = (REPO / lock_path(flavour)).read_text()
    recorded = text.splitlines()[0].removeprefix(DIGEST_PREFIX)
    expected = requirements_digest(runtime_requirements(str(REPO / "pyproject.toml"), flavour))
    assert recorded == expected, f"{lock_path(flavour)} is stale: run python3 scripts/lock.py"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_lock_pins_every_package_with_hashes_within_pyproject_ranges(flavour: str) -> None:
    text = (REPO / lock_path(flavour)).read_text()
    locked = pins(text)
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())
    assert entries and all("--hash=sha256:" in entry for entry in entries), "every pin carries its hashes"
    assert not re.search(r"^(?!#)\S+(>=|<=|~=|>|<)", text, re.M), "a lock pins, it does not range"
    for line in runtime_requirements(str(REPO / "pyproject.toml"), flavour):
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is missing from {lock_path(flavour)}"
        for version in locked[name]:
            assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} outside {line}"
    for runtime in ("onnxruntime", "onnxruntime-gpu"):
        assert (runtime in locked) == (canonicalize_name(flavour.split("[")[0]) == runtime)


def test_dockerfile_installs_from_the_lock() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "--require-hashes" in text and "runtime_requirements.py --lock" in text
    assert "COPY requirements/ requirements/" in text
