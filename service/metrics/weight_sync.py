"""Each weight sync proven: the trainer's digest of the weights it sent for a parameter version,
paired with a rollout worker's digest of what its model loaded (``jobs.weight_digest``).

The two sides print from different processes, so their lines may come in either order; they are
paired by digest. A version is proven once a rollout reported its digest. What is not proven
by the next version's sync is a problem, held for the rest of the attempt (health
``weights_unsynced``, an event naming the version and both digests):

- a version whose digest no rollout reported by the next sync (the rollout kept older weights,
  or said nothing);
- a rollout that read back other values than it was sent (its model did not take them);
- a run whose launch syncs through the digesting checkpoint engine but whose trainer printed no
  digest by its second synced version.

The state is the run's ``weight_syncs`` (one attempt's; a new attempt starts afresh), small and
bounded whatever the job prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.metrics.parse import WeightDigest
from service.store.lifecycle import note
from service.store.models import Run

# The checkpoint engine whose sender and rollout workers print digests (the CPU path's).
DIGESTING_ENGINE = "checkpoint_engine.custom_backend_module=jobs.verl_cpu.weights"
LOOSE_KEPT = 16  # rollout digests kept while they wait for their trainer line
SHORT = 12  # hex digits of a digest in a reason


def expects_digests(run: Run) -> bool:
    """Whether the run's launch syncs weights through the engine that digests both sides."""
    argv = (run.launch or {}).get("argv") or []
    return any(str(arg).endswith(DIGESTING_ENGINE) for arg in argv)


def problem(run: Run) -> str | None:
    """Why the current attempt's weight syncs are not proven, or None."""
    state = run.weight_syncs or {}
    if state.get("attempt") != run.attempt:
        return None
    found = state.get("problem")
    return found if isinstance(found, str) else None


def summary(state: dict[str, Any] | None, attempt: int) -> dict[str, Any] | None:
    """What ``GET /runs/{id}`` shows of the attempt's syncs (``state``, the run's
    ``weight_syncs``): versions proven, the newest one and its digest, versions waiting for
    their rollout, the problem."""
    if not state or state.get("attempt") != attempt:
        return None
    return {
        "proven": state.get("proven", 0),
        "last_version": state.get("last_version"),
        "last_digest": state.get("last_digest"),
        "waiting": sorted(int(v) for v in state.get("pending", {})),
        "problem": state.get("problem"),
    }


def record(
    session: Session,
    run: Run,
    digests: Sequence[WeightDigest],
    synced: Sequence[int],
    final: bool = False,
) -> str | None:
    """Pair what this read of the log said; a problem found now is noted as an event and
    returned (the health check reads it from the run)."""
    state = _state(run)
    if state.get("problem") is not None:
        return None
    found: str | None = None
    # Rollouts first: a rollout line read in the same batch as the next version's trainer line
    # belongs to the sync before it.
    for d in sorted(digests, key=lambda d: d.side != "rollout"):
        found = found or (_rollout(state, d) if d.side == "rollout" else _trainer(state, d))
    if found is None and synced and expects_digests(run):
        top = max(synced)
        if top >= 2 and not state.get("trainer_seen"):
            found = f"no weight digest from the trainer by version {top}: its syncs are unproven"
    if found is None and final and state.get("pending"):
        version, digest = min((int(v), d) for v, d in state["pending"].items())
        found = _unseen(state, version, digest, "by the end of the attempt")
    if found is not None:
        state["problem"] = found
        note(session, run, f"weight sync not proven: {found}"[:1000])
    run.weight_syncs = dict(state)
    return found


def _state(run: Run) -> dict[str, Any]:
    state = dict(run.weight_syncs or {})
    if state.get("attempt") != run.attempt:
        state = {"attempt": run.attempt, "pending": {}, "loose": [], "proven": 0}
    state["pending"] = dict(state.get("pending", {}))
    state["loose"] = list(state.get("loose", []))
    return state


def _rollout(state: dict[str, Any], d: WeightDigest) -> str | None:
    state["rollout_last"] = d.digest
    equal, checked = d.read_back or (0, 0)
    if equal < checked:
        return (
            f"the rollout's model holds other weights than it was sent: {equal} of {checked}"
            f" parameters read back equal (digest {d.digest[:SHORT]})"
        )
    for version, digest in state["pending"].items():
        if digest == d.digest:
            del state["pending"][version]
            _proven(state, int(version), digest)
            return None
    if d.digest != state.get("last_digest"):  # another replica's word on the last version
        state["loose"] = [*state["loose"], d.digest][-LOOSE_KEPT:]
    return None


def _trainer(state: dict[str, Any], d: WeightDigest) -> str | None:
    version = d.version or 0
    state["trainer_seen"] = True
    if d.digest in state["loose"]:
        state["loose"].remove(d.digest)
        _proven(state, version, d.digest)
    else:
        state["pending"][str(version)] = d.digest
    late = [(int(v), digest) for v, digest in state["pending"].items() if int(v) < version]
    if late:
        earliest, digest = min(late)
        return _unseen(state, earliest, digest, f"by version {version}'s sync")
    return None


def _unseen(state: dict[str, Any], version: int, digest: str, when: str) -> str:
    newest = state.get("rollout_last")
    if newest is None:
        said = "no rollout reported a load"
    elif newest == state.get("last_digest"):
        said = f"its newest load was version {state.get('last_version')}'s ({newest[:SHORT]})"
    else:
        said = f"its newest load was {newest[:SHORT]}, which no trainer sent"
    return (
        f"version {version}'s weights (trainer digest {digest[:SHORT]}) never reached the "
        f"rollout {when}: {said}"
    )


def _proven(state: dict[str, Any], version: int, digest: str) -> None:
    state["proven"] = state.get("proven", 0) + 1
    if version >= (state.get("last_version") or 0):
        state["last_version"], state["last_digest"] = version, digest
