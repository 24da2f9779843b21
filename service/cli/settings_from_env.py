"""What the subcommands share: settings from the environment, or an exit that names the bad variable."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from posenc.service.settings import SECRET_SETTINGS, Settings


def settings_or_exit(**overrides: object) -> Settings:
    """Settings from `POSENC_*` (+ CLI overrides); a bad value exits with the variable named."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            got = "a secret, not shown" if field in SECRET_SETTINGS else repr(err.get("input"))
            lines.append(f"  POSENC_{field.upper()}: {err['msg']} (got {got})")
        sys.stderr.write("posenc: invalid configuration:\n" + "\n".join(lines) + "\n")
        raise SystemExit(2) from None
