"""The log handler of `posenc serve`: the records of one event-loop iteration are written together (one write
and flush), records from elsewhere at once, and nothing pending is lost at a flush."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from posenc.service.http.logs import TEXT_FORMAT, LoopBatchedStreamHandler, TextFormatter


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _logger(stream: CountingStream) -> tuple[logging.Logger, LoopBatchedStreamHandler]:
    handler = LoopBatchedStreamHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"posenc.test.batched.{id(stream)}")
    logger.propagate = False
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    return logger, handler


def test_records_of_one_loop_iteration_are_written_together() -> None:
    stream = CountingStream()
    logger, _ = _logger(stream)

    async def requests() -> list[str]:
        for i in range(5):
            logger.info("request %d", i)
        seen = [stream.getvalue()]  # nothing yet: written once the iteration ends
        await asyncio.sleep(0)
        seen.append(stream.getvalue())
        logger.info("next iteration")
        await asyncio.sleep(0)
        return seen

    before, after = asyncio.run(requests())
    assert before == "" and after == "".join(f"request {i}\n" for i in range(5))
    assert stream.getvalue().endswith("next iteration\n") and stream.writes == 2


def test_records_outside_a_loop_are_written_at_once_after_what_is_pending() -> None:
    stream = CountingStream()
    logger, handler = _logger(stream)
    logger.info("start-up")
    assert stream.getvalue() == "start-up\n"

    async def pending() -> None:
        logger.info("in the loop")  # the loop stops before its iteration's write runs

    loop = asyncio.new_event_loop()
    loop.run_until_complete(pending())
    loop.close()
    logger.info("exit")
    assert stream.getvalue() == "start-up\nin the loop\nexit\n"
    asyncio.run(pending())
    handler.flush()  # logging's shutdown flushes every handler
    assert stream.getvalue().endswith("exit\nin the loop\n")


@pytest.mark.parametrize("created", [1700000000.0, 1700000000.999, 1700000001.0005, 1700000001.5, 1699999999.25])
def test_text_formatter_writes_what_logging_writes(created: float) -> None:
    cached, plain = TextFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    for when in (created, created + 0.25, created - 3.5):  # the same second, a later and an earlier one
        record = logging.LogRecord("posenc.access", logging.INFO, __file__, 0, "GET %s", ("/healthz",), None)
        record.created, record.msecs = when, (when - int(when)) * 1000
        assert cached.format(record) == plain.format(record)
