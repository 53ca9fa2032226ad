"""Who listens to a run's lifecycle: registered with the store (``store/announce.py``) once per
process, at start (``create_app``; the tests' conftest), before any run changes.

- ended: the run's accelerator time is added to the usage totals (``usage.accrue``);
- ended off Ray: its failure is settled at once, no log to wait for (``recovery.explain``);
- every event subscribers may want: its webhook deliveries, in the same transaction
  (``notify.outbox.enqueue``).
"""

from __future__ import annotations

import threading

from service import usage
from service.notify import outbox
from service.recovery import explain
from service.store.announce import LISTENERS

_lock = threading.Lock()


def register() -> None:
    """Register the listeners (once: a second call changes nothing)."""
    with _lock:
        if outbox.enqueue in LISTENERS.event:
            return
        LISTENERS.ended.append(usage.accrue)
        LISTENERS.ended_off_ray.append(explain.settle)
        LISTENERS.event.append(outbox.enqueue)
