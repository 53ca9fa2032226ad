"""How well the failure classifier names logs it was not written on; prints a table per set:

    PYTHONPATH=$PWD python tests/benchmarks/bench_diagnosis.py [--quick]

For each class of the held-out whole logs of real verl runs broken on this project's CPU
stack (``tests/data/failures/whole``, split by cause), of the held-out excerpts
(``tests/data/failures/held_out``) and of the rule sets they were written on: how many the
classifier names right, names wrong, and calls ``unknown``, and every miss. Then how long it
takes to read a log as long as the part of a run's log it reads (``explain.READ_CHARS``) that
names no class, the slowest case (every rule scans every line).

``--quick``: the held-out tables, and the timing on a tenth of that length.
"""

from __future__ import annotations

import argparse
import time

from service.recovery.classify import classify
from service.recovery.explain import READ_CHARS
from tests.benchmarks.report import Report, table
from tests.failure_corpus import HELD_OUT, RULE_SET, Score, load, load_whole, score


def per_class(title: str, result: Score) -> str:
    rows: list[list[object]] = [
        [c, result.right[c], result.wrong[c], result.unknown[c]] for c in result.classes()
    ]
    rows.append(
        [
            "**all**",
            f"{sum(result.right.values())} ({result.share(result.right):.0%})",
            f"{sum(result.wrong.values())} ({result.share(result.wrong):.0%})",
            f"{sum(result.unknown.values())} ({result.share(result.unknown):.0%})",
        ]
    )
    misses = "\n".join(f"- {m}" for m in result.misses) or "- none"
    return (
        f"\n#### {title}\n\n"
        + table(["class", "right", "wrong", "unknown"], rows)
        + (f"\n\nmisses:\n{misses}\n")
    )


def slowest_read(chars: int) -> float:
    """Seconds to classify ``chars`` of log lines that name no class."""
    line = "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1 - timing_s/gen:3.2 - perf/mfu:0.4\n"
    log = line * (chars // len(line))
    start = time.perf_counter()
    assert classify(log).cls == "unknown"
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    report = Report("Failure diagnosis")
    whole = score([w.excerpt for w in load_whole("held_out")])
    print(per_class(f"held-out whole real logs ({whole.total} logs)", whole))
    report.add("held-out whole logs right", f"{sum(whole.right.values())}/{whole.total}")
    report.add("held-out whole logs wrong", f"{sum(whole.wrong.values())}/{whole.total}")
    held = score(load(HELD_OUT))
    print(per_class(f"held-out ({held.total} excerpts)", held))
    report.add("held-out right", f"{sum(held.right.values())}/{held.total}")
    report.add("held-out wrong", f"{sum(held.wrong.values())}/{held.total}")
    if args.quick:
        report.skip("rule set", "--quick")
    else:
        rules = score(load(RULE_SET))
        print(per_class(f"rule set ({rules.total} excerpts)", rules))
        own = score([w.excerpt for w in load_whole("rules")])
        print(per_class(f"rule set's whole real logs ({own.total} logs)", own))
        report.add("rule set's whole logs right", f"{sum(own.right.values())}/{own.total}")
        report.add("rule set right", f"{sum(rules.right.values())}/{rules.total}")
    chars = READ_CHARS // 10 if args.quick else READ_CHARS
    report.add(f"classify {chars:,} chars naming no class", f"{slowest_read(chars):.2f} s")
    report.print()


if __name__ == "__main__":
    main()
