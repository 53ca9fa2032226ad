"""The outbox across SIGKILLs: the service (its own process, as deployed) killed at random points
while it delivers 120 webhooks to a receiver that fails every third call.

What "0 lost and 0 duplicated" means here, precisely:

- *lost*: an outbox row (a ``webhook-id``) that the receiver never answered 200 with a verified
  message. Required: none; every row ends ``delivered``.
- *duplicated*: a message sent again after its success was recorded (a call of a ``webhook-id``
  arriving after the row's ``delivered_at``), or a row with two recorded successes. Required:
  none. A message is sent again only when its answer was lost: a 500 (retried by design), or a
  kill between the receiver's 200 and the service recording it, when the same ``webhook-id``
  goes again and a receiver de-duplicating by it takes it once. Those re-sends are counted.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from service.store.db import Database, upgrade
from service.store.lifecycle import transition
from service.store.models import WebhookAttempt, WebhookDelivery
from service.store.status import RunStatus
from tests.conftest import wait_for
from tests.factories import new_run
from tests.service_process import ServiceProcess
from tests.webhook_receiver import VerifyingReceiver

HOOKS, WAVES, RUNS_PER_WAVE = 5, 3, 8  # 5 x 3 x 8 = 120 deliveries, 3 kills


@pytest.mark.slow
def test_sigkills_during_120_deliveries_lose_and_duplicate_no_webhook_id(
    db_url: str, tmp_path: Path
) -> None:
    rng = random.Random(11)
    upgrade(db_url)
    db = Database(db_url)
    receiver = VerifyingReceiver(fail_every=3, delay_s=0.05)
    # No Ray: the notifier needs none, and the events are written here, as a loop would.
    service = ServiceProcess(db_url, "http://127.0.0.1:9", tmp_path / "service.log")
    service.env |= {
        "RLRUN_WEBHOOK_ALLOW": "127.0.0.1/32",
        "RLRUN_WEBHOOK_INTERVAL_S": "0.2",
        "RLRUN_WEBHOOK_RETRY_S": "0.2",
        "RLRUN_WEBHOOK_TIMEOUT_S": "1",
        "RLRUN_WEBHOOK_CLAIM_S": "5",  # a dead replica's claims lapse 5 s after they were made
    }
    try:
        service.start()
        for i in range(HOOKS):
            resp = httpx.post(
                f"{service.url}/webhooks",
                json={"url": f"{receiver.url}/h{i}", "events": ["run.status"]},
                timeout=30,
            )
            assert resp.status_code == 201, resp.text
            receiver.secrets[f"/h{i}"] = resp.json()["secret"]
        for wave in range(WAVES):
            with db.transaction() as s:
                for n in range(RUNS_PER_WAVE):
                    run = new_run(f"w{wave}-{n}", RunStatus.QUEUED)
                    s.add(run)
                    s.flush()
                    transition(s, run, RunStatus.CANCELLED, "crash test")
            # Killed at a random point of this wave's sending (or of its retries).
            wait_for(lambda: len(receiver.calls), lambda n: n > 0, timeout=60, every=0.01)
            time.sleep(rng.uniform(0, 0.8))
            service.kill()
            service.start()

        def outbox() -> list[WebhookDelivery]:
            with db.read() as s:
                rows = list(s.scalars(select(WebhookDelivery)))
                s.expunge_all()
            return rows

        rows = wait_for(
            outbox, lambda rs: all(r.state == "delivered" for r in rs), timeout=240, every=0.5
        )
        with db.read() as s:
            successes = Counter(
                s.scalars(
                    select(WebhookAttempt.delivery_id).where(WebhookAttempt.status_code == 200)
                )
            )
    finally:
        service.stop()
        receiver.close()
        db.dispose()

    assert service.kills == WAVES
    expected = {r.id for r in rows}
    assert len(expected) == HOOKS * WAVES * RUNS_PER_WAVE
    taken = receiver.taken()
    # Every message that came whole was signed and verified (a kill may cut one short).
    assert all(c.message is not None for c in receiver.calls if c.complete)
    # 0 lost: every webhook-id was taken (answered 200), and nothing else was.
    assert {c.webhook_id for c in taken} == expected
    # 0 duplicated: one recorded success per row, and no call after it.
    assert set(successes.values()) == {1} and set(successes) == expected
    delivered_at = {r.id: r.delivered_at.timestamp() for r in rows if r.delivered_at}
    late = [c for c in receiver.calls if c.at > delivered_at[c.webhook_id]]
    assert late == []
    failed = sum(c.status == 500 for c in receiver.calls)
    cut = sum(not c.complete for c in receiver.calls)
    resent_after_200 = len(taken) - len(expected)
    print(
        f"{len(expected)} webhook-ids, {len(receiver.calls)} calls: {failed} answered 500 and "
        f"retried, {resent_after_200} re-sent after a 200 the kill kept from being recorded; "
        f"{cut} cut short by a kill; {service.kills} kills"
    )
    assert failed >= len(receiver.calls) // 3 - 1  # the receiver did fail every third call
