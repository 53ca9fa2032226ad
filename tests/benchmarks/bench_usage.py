"""``GET /usage`` over a year of history: 100 teams x 50 runs a day, on SQLite and PostgreSQL.

    PYTHONPATH=$PWD python tests/benchmarks/bench_usage.py [--teams 100] [--days 365]
    PYTHONPATH=$PWD python tests/benchmarks/bench_usage.py --quick

Each team has 5 users and 3 recipes, so a day holds up to 15 rows per team and one summed over
them (as ``usage.accrue`` leaves them when runs end), plus 100 runs still running. Prints the
median and p95, through the API, of the year's report by team, of a page (the default 500
rows) by team and day (the dashboard's stacked bars) from its start and from its middle, by
user, of the whole report by team and day as CSV (one answer), and of every page of it; and
the median CPU time of this process per call (the service's side: on a machine shared with
other work it varies less than the time; a PostgreSQL server's own is not in it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select

from service import usage
from service.api.usage import _cursor
from service.app import create_app
from service.store.db import Database, upgrade
from service.store.models import UsageTeamTotal, UsageTotal
from service.store.status import RunStatus
from tests import postgres
from tests.conftest import make_settings
from tests.factories import new_run


def fill(url: str, teams: int, days: int, runs_per_day: int) -> None:
    upgrade(url)
    db = Database(url)
    rng = random.Random(1)
    today = datetime.now(UTC).date()
    days_rows: dict[tuple[str, object, str, str, str], list[float]] = {}
    for d in range(days):
        day = today - timedelta(days=d)
        for t in range(teams):
            for _ in range(runs_per_day):
                user, recipe = f"user{rng.randrange(5)}", rng.choice(["verl", "tiny-grpo", "dapo"])
                seconds = rng.choice([8, 16, 32]) * rng.uniform(600, 4 * 3600)
                for cell in (("d", day), ("m", day.replace(day=1))):
                    row = days_rows.setdefault((*cell, f"team{t:03d}", user, recipe), [0.0, 0])
                    row[0] += seconds
                    row[1] += 1
    rows = [
        {
            "period": period,
            "start": start,
            "team": team,
            "user": user,
            "recipe": recipe,
            "accelerator": "NPU",
            "accelerator_seconds": seconds,
            "runs": runs,
        }
        for (period, start, team, user, recipe), (seconds, runs) in days_rows.items()
    ]
    with db.transaction() as s:
        # As runs leave them when they end (usage.accrue), in bulk.
        for i in range(0, len(rows), 5000):
            s.execute(insert(UsageTotal), rows[i : i + 5000])
        summed = select(
            UsageTotal.period,
            UsageTotal.start,
            UsageTotal.team,
            UsageTotal.accelerator,
            func.sum(UsageTotal.accelerator_seconds),
            func.sum(UsageTotal.runs),
        ).group_by(UsageTotal.period, UsageTotal.start, UsageTotal.team, UsageTotal.accelerator)
        s.execute(
            insert(UsageTeamTotal).from_select(
                ["period", "start", "team", "accelerator", "accelerator_seconds", "runs"], summed
            )
        )
        for i in range(100):
            run = new_run(f"live{i}", RunStatus.RUNNING, team=f"team{i % teams:03d}", npus=8)
            run.submitted_at = datetime.now(UTC) - timedelta(hours=rng.uniform(0, 30))
            s.add(run)
    # As a table a year old stands: its statistics gathered and, on PostgreSQL, its pages
    # marked all-visible (index-only scans), as autovacuum leaves them.
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "VACUUM ANALYZE" if db.engine.dialect.name == "postgresql" else "ANALYZE"
        )
    print(f"{url.split(':')[0]}: {len(rows):,} day and month rows")
    db.dispose()


def measure(url: str, days: int, repeats: int) -> list[str]:
    settings = make_settings(url, "http://127.0.0.1:9", run_loops=False, migrate_on_start=False)
    first_day = datetime.now(UTC).date() - timedelta(days=days - 1)
    window = {
        "from": first_day.isoformat(),
        "to": (datetime.now(UTC).date() + timedelta(days=1)).isoformat(),
    }
    by_day: list[usage.GroupBy] = ["team", "day"]
    out = []
    with TestClient(create_app(settings)) as api:
        # A page from the middle of the year, as a dashboard scrolled there asks for it.
        total = api.get("/usage", params=window | {"group_by": by_day}).json()["total_rows"]
        middle = _cursor((first_day + timedelta(days=days // 2), ""), by_day, total)
        cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("team", {"group_by": ["team"]}, {}),
            ("team,day: first page", {"group_by": by_day}, {}),
            ("team,day: a middle page", {"group_by": by_day, "cursor": middle}, {}),
            ("user", {"group_by": ["user"]}, {}),
            ("team,day: all as CSV", {"group_by": by_day}, {"Accept": "text/csv"}),
        ]
        for label, params, headers in cases:
            times, cpu = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                resp = api.get("/usage", params=window | params, headers=headers)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                assert resp.status_code == 200, resp.text
            out.append(_line(url, label, _rows(resp), times, cpu))
        # The whole year by team and day, page after page of the largest size.
        times, cpu = [], []
        for _ in range(max(1, repeats // 4)):
            t0, c0, cursor, rows = time.perf_counter(), time.process_time(), None, 0
            while True:
                more = {"cursor": cursor} if cursor else {}
                page = api.get(
                    "/usage", params=window | {"group_by": by_day, "limit": 10_000} | more
                )
                rows += len(page.json()["rows"])
                cursor = page.json()["next_cursor"]
                if cursor is None:
                    break
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out.append(_line(url, "team,day: every page of 10,000", f"{rows:,}", times, cpu))
    return out


def _rows(resp: Any) -> str:
    if resp.headers["content-type"].startswith("text/csv"):
        return f"{resp.text.count(chr(10)) - 1:,}"
    doc = resp.json()
    return f"{len(doc['rows']):,} of {doc['total_rows']:,}"


def _line(url: str, label: str, rows: str, times: list[float], cpu: list[float]) -> str:
    times.sort()
    return (
        f"| {url.split(':')[0].split('+')[0]} | {label} | {rows} | "
        f"{statistics.median(times) * 1000:.0f} ms | "
        f"{times[int(len(times) * 0.95)] * 1000:.0f} ms | "
        f"{statistics.median(cpu) * 1000:.0f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--runs-per-day", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="10 teams, 30 days")
    args = parser.parse_args()
    teams, days = (10, 30) if args.quick else (args.teams, args.days)
    repeats = 3 if args.quick else 20
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = f"sqlite:///{Path(tmp) / 'usage.db'}"
        fill(sqlite, teams, days, args.runs_per_day)
        lines += measure(sqlite, days, repeats)
        with postgres.admin_url() as admin, postgres.fresh_database(admin, "rlrun_bench") as pg:
            fill(pg, teams, days, args.runs_per_day)
            lines += measure(pg, days, repeats)
    print(f"\nGET /usage over {days} days, {teams} teams x {args.runs_per_day} runs a day")
    print("| database | group by | rows (of the report's) | p50 | p95 | CPU p50 |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
