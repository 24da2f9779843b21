"""Log configuration for `posenc serve`: plain text or one JSON object per line (`POSENC_LOG_FORMAT`).

In JSON mode every record (uvicorn's start-up lines, the service's own, the access log) is one object
with `ts`, `level`, `logger`, `message`; access-log records add `method`, `path`, `route`, `status`,
`duration_ms`, `bytes`, `request_id` and `client` (see `posenc.service.http.metrics.ObservabilityMiddleware`).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from posenc.service.settings import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; `extra={"access": {...}}` fields are merged in at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            doc.update(access)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def log_config(settings: Settings) -> dict[str, Any]:
    """A `logging.config.dictConfig` document for uvicorn's `log_config` argument."""
    formatter: dict[str, Any] = (
        {"()": "posenc.service.http.logs.JsonFormatter"} if settings.log_format == "json" else {"format": TEXT_FORMAT}
    )
    level = settings.log_level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    logger = {"handlers": ["default"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "loggers": {"posenc": logger, "uvicorn": logger, "uvicorn.error": {"level": level},
                    # Requests are logged once, by the service's own access log (it knows the route).
                    "uvicorn.access": {"handlers": [], "propagate": False}},
        # Libraries' own loggers (onnxruntime's Python side, asyncio, ...) in the same format.
        "root": {"handlers": ["default"], "level": "WARNING"},
    }
