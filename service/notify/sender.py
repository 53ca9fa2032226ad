"""The notifier: sends the outbox's due deliveries, signed as Standard Webhooks says.

Each tick claims due rows (``SKIP LOCKED`` on PostgreSQL, so replicas never send one row
twice at once; a claim lapses if its replica dies) and sends them with bounded timeouts: one
subscription's in the order they were written (an attempt's ``run.failed`` before the
``run.retrying`` that follows it), subscriptions in parallel. It reads at most
``MAX_RESPONSE`` bytes of each answer and follows no redirect. A 2xx delivers; anything else is
retried with exponential backoff and jitter until ``max_age_s`` after the event, then the
delivery fails and its subscription is paused. Every try is recorded.

The ``webhook-id`` is the delivery's id, the same on every try, so a receiver de-duplicates a
retry of a message it has already taken (a crash between sending and recording sends again).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import timedelta

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session
from standardwebhooks import Webhook as Signer

from service.backoff import Backoff
from service.clock import utcnow
from service.notify import formats
from service.notify.guard import AllowList, Resolver, UnsafeUrl, check, system_resolver
from service.store.db import Database
from service.store.models import Webhook, WebhookAttempt, WebhookDelivery

log = logging.getLogger(__name__)

MAX_RESPONSE = 64 * 1024
MAX_CLIENTS = 64
# A failed delivery is tried again after 5 s, 10 s, 20 s, ... at most an hour apart.
RETRY = Backoff(5.0, 3600.0)


@dataclass(frozen=True)
class Sent:
    status_code: int | None
    latency_ms: float
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Notifier:
    def __init__(
        self,
        db: Database,
        owner: str,
        allow: AllowList,
        dashboard_url: str,
        timeout_s: float = 10.0,
        backoff: Backoff = RETRY,
        max_age_s: float = 24 * 3600.0,
        claim_s: float = 50.0,
        batch: int = 64,
        resolve: Resolver = system_resolver,
    ) -> None:
        self.db, self.owner, self.allow = db, owner, allow
        self.dashboard_url = dashboard_url
        self.timeout_s, self.backoff, self.max_age_s, self.batch = (
            timeout_s,
            backoff,
            max_age_s,
            batch,
        )
        self.resolve = resolve
        self.claim_s = claim_s
        # Sends of one tick run side by side: one slow receiver does not hold up the rest.
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="notifier")
        # A client per host name, kept: its connections (and TLS sessions) are reused from one
        # delivery to the next, and never serve another name (its SNI, its certificate).
        self._clients: OrderedDict[str, httpx.Client] = OrderedDict()
        self._clients_lock = threading.Lock()

    def close(self) -> None:
        """End the send threads and the kept connections (when the service stops)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            client.close()

    def tick(self, rounds: int = 10) -> None:
        """Send what is due, and again what fell due meanwhile (up to ``rounds`` rounds): an
        event written while a round was sending waits for no interval."""
        for _ in range(rounds):
            claimed = self._claim()
            if not claimed:
                return
            queues: dict[str, list[tuple[WebhookDelivery, Webhook]]] = {}
            for delivery, hook in claimed:
                queues.setdefault(hook.id, []).append((delivery, hook))
            sending = {self.pool.submit(self._send_each, q): q for q in queues.values()}
            # Each subscription's results recorded as they come: a crash re-sends (same
            # webhook-id) only what was in flight, not the whole round.
            for done in as_completed(sending):
                for (delivery, hook), sent in zip(sending[done], done.result(), strict=True):
                    with self.db.transaction() as session:
                        self._record(session, delivery.id, hook.id, sent)

    def _claim(self) -> list[tuple[WebhookDelivery, Webhook]]:
        now = utcnow()
        with self.db.transaction() as session:
            free = WebhookDelivery.claim_owner.is_(None) | (WebhookDelivery.claim_expires_at < now)
            rows = session.scalars(
                select(WebhookDelivery)
                .where(
                    WebhookDelivery.state == "pending",
                    WebhookDelivery.next_attempt_at <= now,
                    free,
                )
                .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.created_at)
                .limit(self.batch)
                .with_for_update(skip_locked=True)
            ).all()
            claimed = []
            for row in rows:
                hook = session.get(Webhook, row.webhook_id)
                if hook is None:
                    continue
                row.claim_owner = self.owner
                row.claim_expires_at = now + timedelta(seconds=self.claim_s)
                session.flush()
                session.expunge(row)
                session.expunge(hook)
                claimed.append((row, hook))
            return claimed

    def _send_each(self, queue: list[tuple[WebhookDelivery, Webhook]]) -> list[Sent]:
        """One subscription's deliveries, one after another in the order claimed (written)."""
        return [self._send(delivery, hook) for delivery, hook in queue]

    def _send(self, delivery: WebhookDelivery, hook: Webhook) -> Sent:
        started = time.perf_counter()
        try:
            target = check(hook.url, self.allow, self.resolve)
            data = formats.body(delivery, hook.format, self.dashboard_url)
            headers = self._signed(delivery, hook, data) | {
                "content-type": "application/json",
                "user-agent": "rlrun-webhooks",
                "host": _host_header(target.host, target.port, target.scheme),
            }
            # Connect to the address checked, by its literal: no second resolution.
            literal = f"[{target.address}]" if ":" in target.address else target.address
            url = httpx.URL(hook.url).copy_with(host=literal)
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            with self._client(target.host).stream(
                "POST", url, content=data, headers=headers, extensions=extensions
            ) as resp:
                _read_bounded(resp)
                return Sent(resp.status_code, _ms(started), _status_error(resp))
        except UnsafeUrl as exc:
            return Sent(None, _ms(started), f"refused: {exc}")
        except httpx.HTTPError as exc:
            return Sent(None, _ms(started), f"{type(exc).__name__}: {exc}"[:300])

    def _client(self, host: str) -> httpx.Client:
        with self._clients_lock:
            client = self._clients.pop(host, None) or httpx.Client(
                timeout=self.timeout_s, follow_redirects=False
            )
            self._clients[host] = client  # the newest at the end
            while len(self._clients) > MAX_CLIENTS:
                _, oldest = self._clients.popitem(last=False)
                oldest.close()  # a send still using it fails and is retried
            return client

    def _signed(self, delivery: WebhookDelivery, hook: Webhook, data: bytes) -> dict[str, str]:
        now = utcnow()
        secrets_ = [hook.secret]
        if hook.previous_secret and hook.previous_until and hook.previous_until > now:
            secrets_.append(hook.previous_secret)
        text = data.decode()
        signatures = [Signer(s).sign(delivery.id, now, text) for s in secrets_]
        return {
            "webhook-id": delivery.id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": " ".join(signatures),
        }

    def _record(self, session: Session, delivery_id: str, hook_id: str, sent: Sent) -> None:
        row = session.get(WebhookDelivery, delivery_id, with_for_update=True)
        if row is None or row.claim_owner != self.owner:
            return
        now = utcnow()
        session.add(
            WebhookAttempt(
                delivery_id=row.id,
                at=now,
                status_code=sent.status_code,
                latency_ms=sent.latency_ms,
                error=sent.error,
            )
        )
        row.attempts += 1
        row.claim_owner = None
        row.claim_expires_at = None
        if sent.ok:
            row.state, row.delivered_at = "delivered", now
            return
        retry_at = now + timedelta(seconds=self._delay(row.attempts))
        if retry_at - row.created_at <= timedelta(seconds=self.max_age_s):
            row.next_attempt_at = retry_at
            return
        row.state = "failed"
        hook = session.get(Webhook, hook_id, with_for_update=True)
        if hook is not None and hook.paused_at is None:
            hook.paused_at = now
            why = sent.error or f"answered {sent.status_code}"
            hook.paused_reason = f"delivery {row.id} failed for {self.max_age_s / 3600:g} h: {why}"
            log.warning("webhook %s paused: %s", hook.id, hook.paused_reason)

    def _delay(self, attempts: int) -> float:
        """Exponential, with jitter so that many receivers that failed together do not retry
        together."""
        return self.backoff.delay(attempts - 1) * random.uniform(0.5, 1.5)


def _read_bounded(resp: httpx.Response) -> None:
    read = 0
    for chunk in resp.iter_raw():
        read += len(chunk)
        if read >= MAX_RESPONSE:
            break


def _status_error(resp: httpx.Response) -> str | None:
    if resp.is_success:
        return None
    if resp.is_redirect:
        return f"redirect to elsewhere ({resp.status_code}), not followed"
    return f"answered {resp.status_code}"


def _host_header(host: str, port: int, scheme: str) -> str:
    default = 443 if scheme == "https" else 80
    name = f"[{host}]" if ":" in host else host
    return name if port == default else f"{name}:{port}"


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
