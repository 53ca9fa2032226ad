"""The cluster's inventory (its nodes, and the jobs on it with what they hold) read from Ray and
cached briefly: one cache shared by the API and the loops, handed to scheduling."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.scheduling.inventory import Inventory
from service.scheduling.outside import ClusterJob, from_state

log = logging.getLogger(__name__)


def read_jobs(ray: RayJobs) -> list[ClusterJob]:
    """The alive jobs on the cluster now, with what they hold (three calls to Ray)."""
    return from_state(
        ray.all_jobs(), ray.state("actors", "ALIVE"), ray.state("placement_groups", "CREATED")
    )


def read_addresses(ray: RayJobs) -> dict[str, dict[str, str]]:
    """Node id -> its ``address`` (IP) and ``hostname``, from Ray's list of alive nodes."""
    return {
        str(n["node_id"]): {
            "address": str(n.get("node_ip") or ""),
            "hostname": str(n.get("node_name") or ""),
        }
        for n in ray.state("nodes", "ALIVE")
        if n.get("node_id")
    }


class InventoryCache:
    """One inventory shared by the API and the loops, re-read from Ray when older than ``ttl_s``.

    Calls block on Ray (with the client's timeout): use them from threads, never the event loop.
    """

    def __init__(self, ray: RayJobs, ttl_s: float) -> None:
        self.ray = ray
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: Inventory | None = None
        # The jobs are re-read at most every ``ttl_s`` (three calls), however fresh the nodes.
        self._jobs: tuple[ClusterJob, ...] = ()
        self._addresses: dict[str, dict[str, str]] = {}
        self._jobs_at = float("-inf")
        self._jobs_failing = False
        # A failed read is remembered as long, so a Ray outage does not stall every caller.
        self._failure: tuple[float, RayUnavailable | RayRejected] | None = None

    def get(self, max_age_s: float | None = None) -> Inventory:
        """The cached inventory, refreshed first if older than ``max_age_s`` (default ttl).

        The jobs on the cluster are re-read at most every ``ttl_s``, by the one caller that
        finds them due, outside the lock: the others go on with the jobs known last."""
        limit = self.ttl_s if max_age_s is None else max_age_s
        with self._lock:
            now = time.time()
            if self._value is not None and now - self._value.fetched_at <= limit:
                return self._value
            if self._failure is not None and now - self._failure[0] <= limit:
                raise self._failure[1]
            try:
                value = Inventory.from_cluster_status(self.ray.cluster_status())
            except (RayUnavailable, RayRejected) as exc:
                self._failure = (now, exc)
                raise
            self._failure = None
            self._value = replace(value, jobs=self._jobs, addresses=self._addresses)
            due = now - self._jobs_at > self.ttl_s
            if not due:
                return self._value
            self._jobs_at = now
        try:
            jobs, addresses = tuple(read_jobs(self.ray)), read_addresses(self.ray)
        except (RayUnavailable, RayRejected, KeyError, TypeError, ValueError) as exc:
            # The nodes are still good; the jobs known last stand until the next read. Said
            # once per run of failures, not every ``ttl_s``.
            (log.debug if self._jobs_failing else log.warning)(
                "reading the jobs on the cluster failed (the last known stand): %r", exc
            )
            self._jobs_failing = True
            return value if self._value is None else self._value
        with self._lock:
            self._jobs_failing = False
            self._jobs, self._addresses = jobs, addresses
            if self._value is not None:
                self._value = replace(self._value, jobs=jobs, addresses=addresses)
            return replace(value, jobs=jobs, addresses=addresses)
