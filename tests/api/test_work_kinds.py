"""A request's work off the event loop (`posenc.service.request_kit.threads` and `.work`): each kind on threads of
its own count, so that one kind cannot take the threads of the others (40 audits at once took all 40 of anyio's, and
uncached tables waited behind them), refused with a 503 and Retry-After past its line; and work whose request was
cancelled stops at its next check."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from posenc.models.audit.found import Found
from posenc.service.audit import run as audit_run
from posenc.service.errors import Unavailable
from posenc.service.http.app import create_app
from posenc.service.request_kit import work
from posenc.service.request_kit.threads import AUDIT_WORK, Kind, ThreadKinds
from posenc.service.request_kit.work import Work, WorkCancelled
from posenc.service.settings import Settings


def test_a_kind_uses_its_own_threads_and_refuses_past_its_line() -> None:
    kinds = ThreadKinds([Kind("audits", 2, waiters=1, wait_seconds=0.5), Kind("tables", 1)])
    release = threading.Event()
    outcomes: list[str] = []

    async def one(name: str) -> None:
        try:
            await kinds.run(name, release.wait, 30)
            outcomes.append(f"{name} done")
        except Unavailable as exc:
            assert exc.headers == {"Retry-After": "1"}
            outcomes.append(f"{name} 503: {exc.message}")

    async def main() -> None:
        running = [asyncio.create_task(one("audits")) for _ in range(2)]
        while kinds.in_use("audits") < 2:
            await asyncio.sleep(0.01)
        waiting = asyncio.create_task(one("audits"))  # the line: one place
        await asyncio.sleep(0.05)
        await one("audits")  # the line is full: refused at once
        # both audit threads busy and one waiting: anyio's own threads (every other run_in_threadpool) are all free,
        # and another kind runs on its own
        assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
        assert await kinds.run("tables", sum, [1, 2]) == 3
        await waiting  # no audit thread frees up within its wait: refused
        release.set()
        await asyncio.gather(*running)
        assert kinds.in_use("audits") == 0

    asyncio.run(main())
    assert outcomes[0].startswith("audits 503: every thread for audits is busy (2 at once; 1 more wait already)")
    assert outcomes[1].startswith("audits 503: every thread for audits is busy (2 at once; none was free within 0.5 s")
    assert outcomes[2:] == ["audits done", "audits done"]


def test_every_step_of_an_audit_runs_on_the_audits_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(Settings())
    kinds: list[str] = []
    run = app.state.process.thread_kinds.run

    async def spied(name: str, call: Any, *args: Any) -> Any:
        kinds.append(name)
        return await run(name, call, *args)

    monkeypatch.setattr(app.state.process.thread_kinds, "run", spied)
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}
    with TestClient(app) as client:
        response = client.post("/v1/audit", params={"config": json.dumps(config)}, content=json.dumps(config))
    assert response.status_code == 200, response.text
    assert len(kinds) >= 3 and set(kinds) == {AUDIT_WORK}  # the ?config= parse, the upload's parse, the judging


def test_an_audit_whose_request_was_cancelled_stops_before_judging(monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[Found] = []
    monkeypatch.setattr(audit_run, "audit_model", lambda found, ref: judged.append(found))
    request = Work("POST /v1/audit")
    request.cancel("its client left")
    found = Found("config.json")
    with work.serving(request), pytest.raises(WorkCancelled, match="POST /v1/audit: stopped, its client left"):
        audit_run.run(found, None, None)
    assert judged == [] and work.running() == []
    audit_run.run(found, None, None)  # outside a cancelled request it judges
    assert judged == [found]
