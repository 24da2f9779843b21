"""Log configuration for `posenc serve`: plain text or one JSON object per line (`POSENC_LOG_FORMAT`).

In JSON mode every record (uvicorn's start-up lines, the service's own, the access log) is one object
with `ts`, `level`, `logger`, `message`; access-log records add `method`, `path`, `route`, `status`,
`duration_ms`, `bytes`, `request_id` and `client` (see `posenc.service.http.metrics.RequestRecorder`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from posenc.service.settings import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT` as logging.Formatter writes it, each second's date and time formatted once: strftime per
    record was most of the cost of formatting an access-log record."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if int(record.created) != second:
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, text)
        return self.default_msec_format % (text, record.msecs) if self.default_msec_format else text


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


class LoopBatchedStreamHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes the records of one event-loop iteration together: one write and flush per
    iteration, not one per record (the access log has a record per request: under load, many an iteration).
    Records emitted where no event loop runs (worker threads, start-up, exit) are written at once, after
    what is pending; `flush` (logging's shutdown calls it) writes whatever is still pending."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._last: logging.LogRecord | None = None  # named by an error report of a failed write
        self._scheduled = False

    def emit(self, record: logging.LogRecord) -> None:  # called with self.lock held
        try:
            self._pending.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)
            return
        self._last = record
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: now
            self._write()
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._write_scheduled)

    def _write_scheduled(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self._scheduled = False
            self._write()

    def _write(self) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:
            if self._last is not None:
                self.handleError(self._last)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()
        super().flush()


def log_config(settings: Settings) -> dict[str, Any]:
    """A `logging.config.dictConfig` document for uvicorn's `log_config` argument."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if settings.log_format == "json"
        else {"()": f"{__name__}.TextFormatter", "fmt": TEXT_FORMAT}
    )
    level = settings.log_level.upper()
    handler = {"class": f"{__name__}.LoopBatchedStreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
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
