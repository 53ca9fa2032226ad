"""A long schemathesis campaign against the API: no input may get a 5xx.

    PYTHONPATH=$PWD nice -n 10 python -m tests.benchmarks.fuzz_api [--cases 50000] [--seed 1]
    PYTHONPATH=$PWD python -m tests.benchmarks.fuzz_api --quick

Every operation of the OpenAPI document is fuzzed, with valid and invalid inputs (schemathesis'
positive and negative modes), in four doors on each database (SQLite and PostgreSQL): auth on
as an admin, as a member of a team, with no token, and auth off (open mode). The store holds
runs in every status, with events, attempts and usage, so that reads find something. A case is
one request. Each answer of 500 or more (or an exception out of the app) is a finding, kept
with the request that caused it; the same finding (operation, status, exception and where it
was raised) is reported once with its count. ``--out FILE`` writes the findings as JSON, the
form ``tests/data/fuzz_examples.json`` keeps (``tests/test_schemathesis.py`` asks each again).

Prints the cases run per door and database, the findings, and the cases per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from service.app import create_app
from service.store.db import Database, upgrade
from service.store.tokens import create as create_token
from tests import postgres
from tests.benchmarks.report import Report
from tests.conftest import make_settings
from tests.factories import fill_for_fuzzing as fill

DOORS = ("admin", "member", "anonymous", "open")
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Open mode answers only for loopback names.
LOOPBACK = {"host": "127.0.0.1"}


@dataclass
class Finding:
    """One kind of 5xx: the first request that got it, and how often it came."""

    operation: str
    status: int
    error: str
    request: dict[str, Any]
    door: str
    database: str
    count: int = 1


@dataclass
class Campaign:
    cases: int = 0
    findings: dict[tuple[str, int, str], Finding] = field(default_factory=dict)

    def record(self, key: tuple[str, int, str], finding: Finding) -> None:
        if key in self.findings:
            self.findings[key].count += 1
        else:
            self.findings[key] = finding
            print(f"5xx: {finding.operation} {finding.status} {finding.error}", flush=True)


def request_of(case: Any, headers: dict[str, str]) -> dict[str, Any]:
    """A case as the plain request it made (what the stored examples replay)."""
    body = None if _unset(case.body) else case.body
    if isinstance(body, bytes):
        body = body.decode("latin-1")
    return {
        "method": case.method.upper(),
        "path": case.formatted_path,
        "query": case.query or {},
        "headers": {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"},
        "body": body,
        "media_type": case.media_type,
    }


def _unset(value: Any) -> bool:
    return type(value).__name__ == "NotSet"


def where(exc: BaseException) -> str:
    """An exception and the project's frame that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/service/" in f.filename]
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:200]}{at}"


def run_door(
    app: FastAPI,
    door: str,
    headers: dict[str, str],
    share: int,
    seed: int,
    campaign: Campaign,
    database: str,
) -> int:
    """Fuzz every operation through one door, in rounds of a seed each, until ``share`` cases
    have run (or a round runs none: every input space is exhausted); the cases run."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    per_operation = max(len(MODES), share // len(operations))
    before = campaign.cases
    for round_seed in range(seed, seed + 1000):
        at = campaign.cases
        fuzz_round(operations, headers, per_operation, round_seed, campaign, door, database)
        if campaign.cases - before >= share or campaign.cases == at:
            break
    return campaign.cases - before


def fuzz_round(
    operations: list[Any],
    headers: dict[str, str],
    per_operation: int,
    seed: int,
    campaign: Campaign,
    door: str,
    database: str,
) -> None:
    for operation in operations:
        for mode in MODES:
            one = fuzz_test(operation, mode, per_operation, seed, headers, campaign, door, database)
            try:
                one()
            except Unsatisfiable:
                pass  # no input to make invalid (an operation without parameters)
            except Exception as exc:  # generation itself failed: say so, go on
                print(f"{operation.label} ({mode.value}): not generated: {exc!r}", flush=True)


def fuzz_test(
    operation: Any,
    mode: GenerationMode,
    per_operation: int,
    seed: int,
    headers: dict[str, str],
    campaign: Campaign,
    door: str,
    database: str,
) -> Any:
    """A Hypothesis test that tries one operation's cases of one mode."""

    @hypothesis_seed(seed)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=max(1, per_operation // len(MODES)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(case: Any) -> None:
        try_case(case, operation.label, headers, campaign, door, database)

    return one


def try_case(
    case: Any, label: str, headers: dict[str, str], campaign: Campaign, door: str, database: str
) -> None:
    """One request; a finding when it gets a 5xx or the app raises."""
    campaign.cases += 1
    try:
        response = case.call(headers=headers)
    except Exception as exc:  # the app raised: a 500 to the caller
        status, error = 500, where(exc)
        key = (label, status, error)
    else:
        if response.status_code < 500:
            return
        status, error = response.status_code, response.text[:300]
        key = (label, status, error[:120])
    request = request_of(case, headers)
    campaign.record(key, Finding(label, status, error, request, door, database))


@contextmanager
def service(url: str, auth: str) -> Iterator[tuple[FastAPI, dict[str, str]]]:
    """The app on a filled database (no loops, no Ray), and the tokens by door."""
    upgrade(url)
    db = Database(url)
    with db.transaction() as s:
        tokens = {
            "admin": create_token(s, "fuzz-admin", "vision", "admin")[1],
            "member": create_token(s, "fuzz-member", "vision", "member")[1],
        }
    fill(db)
    db.dispose()
    app = create_app(make_settings(url, "http://127.0.0.1:9", run_loops=False, auth=auth))
    with TestClient(app):
        yield app, tokens


def headers_of(door: str, tokens: dict[str, str]) -> dict[str, str]:
    if door == "open":
        return dict(LOOPBACK)
    if door == "anonymous":
        return {}
    return {"Authorization": f"Bearer {tokens[door]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=50_000, help="cases in all (about)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--out", type=Path, help="write the findings here as JSON")
    parser.add_argument("--quick", action="store_true", help="a few cases per operation")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # 5xx are counted here; the app's logs would drown them
    databases = args.databases.split(",")
    total = 2 * len(DOORS) * len(databases) if args.quick else args.cases
    campaign = Campaign()
    report = Report("Schemathesis campaign")
    started = time.perf_counter()
    with ExitStack() as stack:
        for database in databases:
            for door in DOORS:
                if database == "sqlite":
                    tmp = stack.enter_context(_tempdir())
                    url = f"sqlite:///{tmp}/rlrun.db"
                else:
                    admin = stack.enter_context(postgres.admin_url())
                    url = stack.enter_context(postgres.fresh_database(admin, "rlrun_fuzz"))
                auth = "off" if door == "open" else "on"
                with service(url, auth) as (app, tokens):
                    share = total // (len(databases) * len(DOORS))
                    headers = headers_of(door, tokens)
                    ran = run_door(app, door, headers, share, args.seed, campaign, database)
                report.add(f"cases, {database}, {door}", f"{ran:,}")
    elapsed = time.perf_counter() - started
    report.add("cases in all", f"{campaign.cases:,}")
    report.add("cases per second", f"{campaign.cases / elapsed:.0f}")
    report.add("kinds of 5xx found", str(len(campaign.findings)))
    for finding in campaign.findings.values():
        report.add(
            f"5xx {finding.operation} ({finding.database}, {finding.door}, x{finding.count})",
            f"{finding.status}: {finding.error[:160]}".replace("|", "/").replace("\n", " "),
        )
    if args.out:
        found = [
            {
                "found": f"{f.operation}: {f.status} {f.error[:200]} ({f.database}, {f.door})",
                "request": f.request,
            }
            for f in campaign.findings.values()
        ]
        args.out.write_text(json.dumps(found, indent=2, default=str) + "\n")
    report.print()


@contextmanager
def _tempdir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        yield tmp


if __name__ == "__main__":
    main()
