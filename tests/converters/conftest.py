"""The converter matrix: artifacts written by the real third-party tools at pinned versions and audited by `posenc
audit` (scripts/converter-matrix-test.sh builds their environment and runs these tests). Every test here is marked
`converters` and `torch` (FOLDER_MARKS in tests/conftest.py): the other test runs deselect them.

The vocabularies are trained once a session; each module writes its model's checkpoint and converts it once. Where
POSENC_CONVERTER_MATRIX_REPORT names a file, the session writes the matrix there (markdown: every audit's artifact,
tool, reference, verdict, exit status, seconds and peak RSS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.checkpoints import byte_level_tokenizer, sentencepiece_tokenizer
from tests.converters.tools import REPORT_ENV, need_modules, records_path, write_report


def pytest_configure(config: pytest.Config) -> None:
    records = records_path()
    if records is not None and not hasattr(config, "workerinput"):
        records.unlink(missing_ok=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its worker's own hook)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The groups pytest-xdist's loadgroup hands out whole (scripts/converter-matrix-test.sh): a module's tests
    together (they share its checkpoints), but a table's rows (a test parametrized with `row`) each a group of its
    own, so that the architectures of one table spread over the workers, each row's checkpoint built once."""
    here = Path(__file__).parent
    for item in items:
        if here not in item.path.parents or item.get_closest_marker("xdist_group") is not None:
            continue
        callspec = getattr(item, "callspec", None)
        row = callspec.params.get("row") if callspec is not None else None
        name = item.path.stem if row is None else f"{item.path.stem}[{row.model.name}]"
        item.add_marker(pytest.mark.xdist_group(name))


def pytest_sessionfinish(session: pytest.Session) -> None:
    import os

    records = records_path()
    if records is not None and not hasattr(session.config, "workerinput"):
        write_report(Path(os.environ[REPORT_ENV]))


@pytest.fixture(scope="session")
def sentencepiece_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_modules("torch", "transformers", "sentencepiece")
    return sentencepiece_tokenizer(tmp_path_factory.mktemp("sentencepiece"))


@pytest.fixture(scope="session")
def byte_level_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_modules("torch", "transformers", "tokenizers")
    return byte_level_tokenizer(tmp_path_factory.mktemp("byte-level"))


@pytest.fixture(scope="session")
def byte_level_chat_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The byte-level BPE with a chat's special tokens too (GLM-4's converter looks up <|user|>; GLM-4.5's
    [gMASK] and <|observation|> as well; Dots3-Note's <|endofassistant|>)."""
    need_modules("torch", "transformers", "tokenizers")
    return byte_level_tokenizer(tmp_path_factory.mktemp("byte-level-chat"),
                                ("<|endoftext|>", "<|user|>", "[gMASK]", "<|observation|>", "<|endofassistant|>"))
