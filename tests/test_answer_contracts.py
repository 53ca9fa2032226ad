"""Each answer's builder and its response model agree: every key a builder makes is a field of
its model, every field is made, down every nested document (the typed client drops a key its
model lacks without a word). A run's documents are built from the rows its reads select, so a
builder that reads a column the read leaves out fails here too."""

from __future__ import annotations

import types
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from service.metrics import store
from service.metrics.parse import MetricLine
from service.operations.run_docs import run_doc, summary_doc
from service.store.db import Database
from service.store.lifecycle import note
from service.store.models import Run, RunStatus, utcnow
from service.store.runs import events_of, page_query, run_row
from service.wire.documents import encode
from service.wire.runs import RunOut, RunSummary
from tests.factories import add_run


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models an annotation holds (``X``, ``X | None``, ``list[X]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    elif get_origin(annotation) in (Union, types.UnionType, list, tuple):
        for arg in get_args(annotation):
            yield from _models(arg)


def unmatched(model: type[BaseModel], doc: dict[str, Any], at: str = "") -> list[str]:
    """Where ``doc`` and ``model`` disagree: keys that are no field, fields with no key, in
    ``doc`` and every nested document whose field is a model."""
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    out = [f"{at}{key}: no field of {model.__name__}" for key in doc.keys() - fields.keys()]
    out += [f"{at}{key}: not made" for key in fields.keys() - doc.keys()]
    for key in sorted(doc.keys() & fields.keys()):
        nested = next(_models(fields[key].annotation), None)
        value = doc[key]
        if nested is None or value is None:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                out += unmatched(nested, item, f"{at}{key}[{i}].")
        else:
            out += unmatched(nested, value, f"{at}{key}.")
    return out


def _store_runs(db: Database) -> None:
    """A running run that shows every part it can (a checkpoint, a stop on its way, a failure,
    weight syncs, events and metrics) and a queued one that waits for its team's budget."""
    now = utcnow()
    add_run(
        db,
        "full",
        RunStatus.RUNNING,
        cluster="c1",
        ray_status="RUNNING",
        ray_message="running",
        checkpoint_step=4,
        checkpoint_at=now,
        yield_by=now + timedelta(minutes=5),
        yield_then="STOPPED",
        yield_reason="asked",
        stop_requested_at=now,
        retry_at=now,
        deadline_at=now,
        preflight={"ok": True},
        failure={"class": "actor_died", "summary": "s", "hint": "h", "evidence": [
            {"offset": 3, "line": "x"}
        ]},
        weight_syncs={"attempt": 1, "proven": 1, "last_version": 1, "last_digest": "ab"},
    )  # fmt: skip
    add_run(
        db,
        "queued",
        RunStatus.QUEUED,
        queue_reason="budget",
        budget_wait={
            "month": "2026-12",
            "used_hours": 2.0,
            "budget_hours": 1.0,
            "over_by_hours": 1.0,
            "accelerator": "NPU",
        },
    )
    with db.transaction() as s:
        store.add_lines(s, "full", [(10, MetricLine(1, {"critic/score/mean": 0.5}))])
        run = s.get(Run, "full")
        assert run is not None
        note(s, run, "a checkpoint", kind="checkpoint", step=4)


@pytest.mark.parametrize("run_id", ["full", "queued"])
def test_a_runs_document_is_its_model(sqlite_db: Database, run_id: str) -> None:
    _store_runs(sqlite_db)
    with sqlite_db.read() as s:
        row = run_row(s, run_id)  # the columns the run's read selects, and no other
        doc = run_doc(row, events_of(s, run_id), store.latest(s, run_id))
    assert unmatched(RunOut, doc) == []
    RunOut.model_validate_json(encode(doc))


def test_a_runs_summary_is_its_model(sqlite_db: Database) -> None:
    _store_runs(sqlite_db)
    with sqlite_db.read() as s:
        rows = s.connection().execute(page_query(False, False, False), {"limit": 10}).all()
    assert len(rows) == 2
    for row in rows:
        doc = summary_doc(row)
        assert unmatched(RunSummary, doc) == []
        RunSummary.model_validate_json(encode(doc))


def test_the_check_finds_a_key_no_field_holds_and_a_field_not_made(sqlite_db: Database) -> None:
    _store_runs(sqlite_db)
    with sqlite_db.read() as s:
        doc = run_doc(run_row(s, "full"), events_of(s, "full"))
    del doc["health"]
    doc["ray"] = doc["ray"] | {"pid": 1}
    doc["events"] = [{k: v for k, v in e.items() if k != "kind"} for e in doc["events"]]
    assert sorted(unmatched(RunOut, doc | {"colour": "red"})) == [
        "colour: no field of RunOut",
        "events[0].kind: not made",
        "health: not made",
        "ray.pid: no field of RayOut",
    ]
