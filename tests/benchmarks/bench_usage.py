"""``GET /usage`` over a year of history: 100 teams x 50 runs a day, on SQLite and PostgreSQL.

    PYTHONPATH=$PWD python tests/benchmarks/bench_usage.py [--teams 100] [--days 365]
    PYTHONPATH=$PWD python tests/benchmarks/bench_usage.py --quick

Each team has 5 users and 3 recipes, so a day holds up to 15 rows per team and one summed over
them (as ``usage.accrue`` leaves them when runs end), plus 100 runs still running. Prints the
median and p95 of the year's report by team, by team and day (the dashboard's stacked bars),
and by user, through the API.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select

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
    print(f"{url.split(':')[0]}: {len(rows):,} day and month rows")
    db.dispose()


def measure(url: str, days: int, repeats: int) -> list[str]:
    settings = make_settings(url, "http://127.0.0.1:9", run_loops=False, migrate_on_start=False)
    start = (datetime.now(UTC).date() - timedelta(days=days - 1)).isoformat()
    end = (datetime.now(UTC).date() + timedelta(days=1)).isoformat()
    out = []
    with TestClient(create_app(settings)) as api:
        for groups in (["team"], ["team", "day"], ["user"]):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                resp = api.get("/usage", params={"from": start, "to": end, "group_by": groups})
                times.append(time.perf_counter() - t0)
                assert resp.status_code == 200, resp.text
            times.sort()
            rows = len(resp.json()["rows"])
            out.append(
                f"| {url.split(':')[0].split('+')[0]} | {','.join(groups)} | {rows:,} | "
                f"{statistics.median(times) * 1000:.0f} ms | "
                f"{times[int(len(times) * 0.95)] * 1000:.0f} ms |"
            )
    return out


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
    print("| database | group by | rows | p50 | p95 |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
