"""A wrong POSENC_* value stops start-up with exit status 2 and a message naming the variable."""

import subprocess
from pathlib import Path

import pytest

from posenc.service.testing import serve_command, serve_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("variable", "value"),
    [("POSENC_PORT", "eighty"), ("POSENC_CACHE_BYTES", "-1"), ("POSENC_LOG_FORMAT", "xml"),
     ("POSENC_ACCESS_LOG", "maybe"), ("POSENC_LOG_LEVEL", "loud")],
)
def test_bad_variable_exits_2_naming_it(variable: str, value: str) -> None:
    env = serve_env({variable: value}, base={"PATH": "/usr/bin:/bin"}, pythonpath=[REPO])
    result = subprocess.run(serve_command(), env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert variable in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_or_exit_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from posenc.service.cli.settings_from_env import settings_or_exit

    monkeypatch.setenv("POSENC_MAX_TABLE_BYTES", "lots")
    with pytest.raises(SystemExit) as exc:
        settings_or_exit()
    assert exc.value.code == 2
    assert "POSENC_MAX_TABLE_BYTES" in capsys.readouterr().err


def test_good_log_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.service.settings import Settings

    monkeypatch.setenv("POSENC_LOG_FORMAT", "json")
    monkeypatch.setenv("POSENC_ACCESS_LOG", "false")
    settings = Settings()
    assert settings.log_format == "json" and settings.access_log is False
