"""The per-team limit of accepted runs per minute is exact under concurrency, on both databases:
concurrent accepts of one team count and insert in turn."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
from sqlalchemy import func, select

from service.app import create_app
from service.store.db import Database, upgrade
from service.store.models import Run
from service.store.tokens import create as create_token
from tests.conftest import make_settings
from tests.live import ServerThread

LIMIT = 5


def test_concurrent_accepts_of_one_team_never_pass_the_limit(db_url: str) -> None:
    upgrade(db_url)
    db = Database(db_url)
    with db.transaction() as s:
        secrets = [create_token(s, f"m{i}", "vision", "member")[1] for i in range(4)]
        _, other = create_token(s, "o", "speech", "member")
    settings = make_settings(
        db_url,
        "http://127.0.0.1:9",
        run_loops=False,
        auth="on",
        runs_per_team_per_minute=LIMIT,
        validations_per_caller=50,
    )
    statuses: list[int] = []
    with ServerThread(create_app(settings)) as url:
        go = threading.Barrier(24)

        def submit(secret: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                go.wait()
                resp = http.post(
                    "/runs",
                    json={"recipe": "test-script"},
                    headers={"Authorization": f"Bearer {secret}"},
                )
                statuses.append(resp.status_code)

        threads = [threading.Thread(target=submit, args=(secrets[i % 4],)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        tally: Counter[Any] = Counter(statuses)
        assert tally == {201: LIMIT, 429: 24 - LIMIT}, tally
        # Another team's limit is its own.
        resp = httpx.post(
            f"{url}/runs",
            json={"recipe": "test-script"},
            headers={"Authorization": f"Bearer {other}"},
        )
        assert resp.status_code == 201, resp.text
    with db.read() as s:
        assert s.scalar(select(func.count()).where(Run.team == "vision")) == LIMIT
    db.dispose()
