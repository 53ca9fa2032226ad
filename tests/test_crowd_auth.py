"""With auth on, a crowd of callers from two teams and attackers at once, against the real service
(a child process, loops running, Ray unreachable): each caller sees only its team's runs, a bad
token is a 401, a token revoked mid-flood is refused from the moment its revocation answers, and
nothing else but a shed 503 (with Retry-After) comes back.

The run reads and token checks it drives are the ones made on the event loop (``Database.rows``,
``auth.resolve``), on both databases, with the read cache keeping answers for other callers."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from service.store import tokens
from service.store.db import Database
from tests.loadgen import SPEC
from tests.service_process import ServiceProcess

CLIENTS = 300
LOAD_S = 6.0
RUNS_PER_TEAM = 5


@dataclass
class Crowd:
    """What the crowd saw: statuses by action, and every answer that broke a rule."""

    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)
    revoked_at: float | None = None  # when the revocation answered (monotonic)


def _token(db: Database, user: str, team: str, role: tokens.Role) -> tuple[str, str]:
    with db.transaction() as s:
        row, secret = tokens.create(s, user, team, role, "crowd-test")
        return row.id, secret


async def _caller(
    http: aiohttp.ClientSession,
    crowd: Crowd,
    rng: random.Random,
    secrets: dict[str, str],
    runs: dict[str, list[str]],
    until: float,
) -> None:
    while time.monotonic() < until:
        action = rng.choice(["own", "other", "page", "garbage", "doomed", "submit"])
        who, path, method = "red", f"/runs/{rng.choice(runs['red'])}", "GET"
        if action == "other":
            path = f"/runs/{rng.choice(runs['blue'])}"
        elif action == "page":
            path = "/runs?limit=20"
        elif action == "garbage":
            who = "garbage"
        elif action == "doomed":
            who, path = "doomed", f"/runs/{rng.choice(runs['blue'])}"
        elif action == "submit":
            who, path, method = "blue", "/runs", "POST"
        sent = time.monotonic()
        headers = {"Authorization": f"Bearer {secrets[who]}"}
        body = {**SPEC, "name": "crowd"} if method == "POST" else None
        async with http.request(method, path, json=body, headers=headers) as resp:
            status = resp.status
            doc = await resp.json(content_type=None) if status < 300 else None
            retry_after = resp.headers.get("Retry-After")
        crowd.statuses[(action, status)] += 1
        if status == 503 and retry_after:  # shed: a bounded refusal, allowed under any load
            await asyncio.sleep(float(retry_after) * rng.uniform(0.5, 1.0))  # as a client would
            continue
        expected = {"own": 200, "other": 404, "page": 200, "garbage": 401, "submit": 201}
        if action == "doomed":
            revoked = crowd.revoked_at is not None and sent > crowd.revoked_at
            ok = status == 401 if revoked else status in (200, 401)
        else:
            ok = status == expected[action]
        if not ok:
            crowd.broken.append(f"{action} {path}: {status}")
        elif action == "own" and doc["team"] != "red":
            crowd.broken.append(f"red read {path} of team {doc['team']}")
        elif action == "page" and any(run["team"] != "red" for run in doc["items"]):
            crowd.broken.append("red's page holds another team's run")
        elif action == "submit" and doc["team"] != "blue":
            crowd.broken.append(f"blue's run is {doc['team']}'s")


async def _flood(
    url: str, secrets: dict[str, str], runs: dict[str, list[str]], revoke: Any
) -> Crowd:
    crowd = Crowd()
    until = time.monotonic() + LOAD_S
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as http:

        async def revoke_half_way() -> None:
            await asyncio.sleep(LOAD_S / 2)
            await revoke()
            crowd.revoked_at = time.monotonic()

        callers = [
            _caller(http, crowd, random.Random(n), secrets, runs, until) for n in range(CLIENTS)
        ]
        await asyncio.gather(revoke_half_way(), *callers)
    return crowd


@pytest.mark.slow
def test_a_crowd_of_two_teams_and_attackers_sees_only_what_its_tokens_allow(
    db_url: str, tmp_path: Path
) -> None:
    db = Database(db_url)
    try:
        secrets = {"garbage": "rlrun_" + "x" * 43}
        for team in ("red", "blue"):
            secrets[team] = _token(db, f"{team}-member", team, "member")[1]
        doomed_id, secrets["doomed"] = _token(db, "doomed", "blue", "viewer")
        admin = _token(db, "ops", "ops", "admin")[1]
    finally:
        db.dispose()
    service = ServiceProcess(db_url, "http://127.0.0.1:9", tmp_path / "service.log")
    service.env |= {
        "RLRUN_AUTH": "on",
        "RLRUN_VALIDATIONS_PER_CALLER": "1000",
        "RLRUN_RUNS_PER_TEAM_PER_MINUTE": "0",
    }
    service.start()
    try:
        runs: dict[str, list[str]] = {}
        with httpx.Client(base_url=service.url, timeout=30) as http:
            for team in ("red", "blue"):
                auth = {"Authorization": f"Bearer {secrets[team]}"}
                made = [http.post("/runs", json=SPEC, headers=auth) for _ in range(RUNS_PER_TEAM)]
                runs[team] = [r.json()["id"] for r in made]

        async def revoke() -> None:
            # Shed like any request under the flood: retried as its Retry-After says.
            async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
                auth = {"Authorization": f"Bearer {admin}"}
                while (
                    answer := await http.delete(f"/tokens/{doomed_id}", headers=auth)
                ).status_code == 503:
                    await asyncio.sleep(float(answer.headers["retry-after"]) / 10)
                assert answer.is_success, answer.text

        crowd = asyncio.run(_flood(service.url, secrets, runs, revoke))
    finally:
        service.stop()
    print(f"\n{db_url.split(':')[0]}: {dict(sorted(crowd.statuses.items()))}")
    assert not crowd.broken, crowd.broken[:20]
    answered = Counter(action for (action, status), n in crowd.statuses.items() for _ in range(n))
    # Every kind of call was answered many times over, the doomed token both ways.
    assert min(answered.values()) > 50, answered
    assert crowd.statuses[("doomed", 200)] > 0 and crowd.statuses[("doomed", 401)] > 0
