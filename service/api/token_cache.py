"""API tokens that signed in, kept for a moment: a caller polling a run pays for its token's
row once a ``ttl_s``, not on every request.

Only tokens found active are kept (a wrong secret is looked up, and counted, every time), by the
SHA-256 of the secret, as the database keeps them. A revocation ends one at once where it is told:
on this replica at its commit (``Database.on_commit``, before the revoking request answers), on
another replica on PostgreSQL when the change feed tells it (``store/change_feed.py``). A token
revoked where neither reaches (another process on SQLite, a lost notification) is trusted for
``ttl_s`` at most, which ``rlrun token revoke`` waits out before it answers.
"""

from __future__ import annotations

import threading
import time

from service.principal import Principal
from service.store.changes import Changes

# Tokens kept at most; past it the oldest go first.
MAX_TOKENS = 10_000


class TokenCache:
    def __init__(self, ttl_s: float, max_tokens: int = MAX_TOKENS) -> None:
        self._ttl_s = ttl_s
        self._max = max_tokens
        # Digest -> (when it was read, who it is); token id -> digest, to forget by id.
        self._kept: dict[str, tuple[float, Principal]] = {}
        self._digests: dict[str, str] = {}
        self._revocations = 0  # writes told that revoked some token
        self._lock = threading.Lock()  # dict updates only: told from writer threads too

    def get(self, digest: str) -> Principal | None:
        """Who the token with this digest is, if it signed in less than ``ttl_s`` ago."""
        kept = self._kept.get(digest)
        if kept is None or time.monotonic() - kept[0] >= self._ttl_s:
            return None
        return kept[1]

    def ticket(self) -> tuple[int, float]:
        """Taken before a token's row is read, and handed to ``keep``."""
        return self._revocations, time.monotonic()

    def keep(self, digest: str, principal: Principal, ticket: tuple[int, float]) -> None:
        """``principal`` read for ``digest`` by a read that began at ``ticket``; not kept if a
        revocation was told since (the read may predate it)."""
        if self._ttl_s <= 0 or principal.token_id is None:
            return
        revocations, read_at = ticket
        with self._lock:
            if revocations != self._revocations:
                return
            while len(self._kept) >= self._max:
                self._forget_digest(next(iter(self._kept)))
            self._kept[digest] = (read_at, principal)
            self._digests[principal.token_id] = digest

    def changed(self, changes: Changes) -> None:
        """Forget the tokens a write revoked (every one, if it may have revoked any)."""
        if not (changes.everything or changes.tokens):
            return
        with self._lock:
            self._revocations += 1
            if changes.everything:
                self._kept.clear()
                self._digests.clear()
                return
            for token_id in changes.tokens:
                digest = self._digests.pop(token_id, None)
                if digest is not None:
                    self._kept.pop(digest, None)

    def _forget_digest(self, digest: str) -> None:
        _at, principal = self._kept.pop(digest)
        if principal.token_id is not None:
            self._digests.pop(principal.token_id, None)
