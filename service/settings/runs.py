"""Sections of what runs may ask and get: recipes, limits, admission, the background loops
and retries."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from service.retry_policy import MAX_ATTEMPTS, RetryPolicy
from service.settings.base import Names, Section


class RecipeSettings(Section):
    """The recipes, and what a spec may ask of the cluster, widened only here."""

    heading: ClassVar[str] = "Recipes and what a spec may ask"

    recipe_plugins: Names = []
    """Extra recipes: "module:function" entries, each called with the registry."""
    env_allow: Names = []
    """Env var names exempt from the deny-list."""
    override_allow: Names = []
    """Hydra keys (prefixes) an override may set although refused by default."""


class LimitSettings(Section):
    """What one request, caller, team or run may take."""

    heading: ClassVar[str] = "Limits"

    max_body_bytes: int = 1_000_000
    """The largest request body; larger: 413."""
    body_timeout_s: float = Field(default=10.0, gt=0)
    """A request body not fully arrived this long after its headers: 408 (and the connection
    closed). Until it is in, a request holds no slot of max_requests_in_progress."""
    runs_per_team_per_minute: int = Field(default=120, ge=0)
    """Accepted runs per team per minute (0: no limit)."""
    streams_per_caller: int = Field(default=16, ge=1)
    """Live event streams one caller may hold open."""
    validations_per_caller: int = Field(default=2, ge=1)
    """Specs one caller may have validated at once (dry runs and submissions); one more is a
    429."""
    metric_keys_per_request: int = Field(default=200, ge=1)
    """Metric keys one request may ask for."""
    cluster_list_limit: int = Field(default=500, ge=1)
    """Rows per page of /cluster."""
    metric_keys_per_run: int = Field(default=2_000, ge=1)
    """Distinct metric keys one run may store (verl logs a few hundred; past the limit only new
    keys are dropped)."""
    metric_points_per_run: int = Field(default=20_000_000, ge=1)
    """Metric points one run may store (100 keys x 200,000 steps: about 2.5 GiB on SQLite and
    5 GiB on PostgreSQL at the measured bytes per point; past it nothing more is stored)."""


class AdmissionSettings(Section):
    """Who gets the accelerators: quotas, node groups, priorities."""

    heading: ClassVar[str] = "Admission"

    team_quotas: dict[str, int] = {}
    """Accelerators a team may hold at once, e.g. RLRUN_TEAM_QUOTAS='{"vision": 16}'."""
    default_team_quota: int | None = None
    """The quota of teams team_quotas does not list (unset: unlimited)."""
    team_nodes: dict[str, str] = {}
    """Nodes per team: team -> node group, a Ray custom resource the group's nodes carry, e.g.
    RLRUN_TEAM_NODES='{"vision": "group-a", "*": "shared"}' ("*": every team not named)."""
    high_priority_teams: Names = []
    """Teams whose members may submit priority "high" (admins always may)."""
    team_budgets: dict[str, float] = {}
    """Accelerator-hours a team may use per UTC month, e.g. RLRUN_TEAM_BUDGETS='{"nlp": 800}'.
    Past it, the team's new runs wait with the reason "budget" until the month turns or an
    admin lets one through (POST /runs/{id}/admit-over-budget)."""
    default_team_budget: float | None = Field(default=None, ge=0)
    """The budget of teams team_budgets does not list (unset: no budget)."""


class LoopSettings(Section):
    """The background loops: submitting, reconciling with Ray, watching for stuck runs."""

    heading: ClassVar[str] = "Background loops"

    run_loops: bool = True
    """Run the background loops in this replica (off: an API-only replica)."""
    submit_interval_s: float = 1.0
    """How often queued runs are admitted and submitted."""
    reconcile_interval_s: float = 2.0
    """How often submitted runs' states are read back from Ray (and unmanaged jobs looked
    at)."""
    claim_ttl_s: float = 60.0
    """A replica's hold on a run it submits."""
    submit_batch: int = 16
    """Runs admitted per round at most."""
    max_backoff_s: float = 30.0
    """The longest a failing loop waits before its next try."""
    stop_grace_s: int = 120
    """Grace period between SIGTERM and SIGKILL when a run is stopped (time to checkpoint)."""
    watchdog_interval_s: float = 10.0
    """How often the watchdog looks for stuck runs."""
    stuck_submitted_s: float = 600.0
    """A submitted run not RUNNING after this long is stuck."""
    stuck_silent_s: float = 1800.0
    """A RUNNING run silent this long is stuck."""
    stop_stuck: bool = False
    """Stop stuck runs (else only their health says stuck)."""
    unschedulable_after_s: float = Field(default=20.0, gt=0)
    """A RUNNING run without a new step this long is checked against Ray's state API (its job's
    actors pending creation, placement groups pending) each watchdog round; a demand no node's
    free resources can hold makes its health unschedulable."""
    stop_unmanaged_after_s: float | None = Field(default=None, ge=0)
    """Jobs on the cluster that are no runs of the service are stopped this long after Ray
    started them, each with an audit row (unset: never; they are shown and counted all the
    same)."""


class RetrySettings(Section):
    """Retries: the policy of runs whose spec names none, and how many attempts a run may
    make (a spec's ``retry`` asks within these)."""

    heading: ClassVar[str] = "Retries"

    retry_default: RetryPolicy | None = None
    """The policy of runs whose spec has no ``retry`` (unset: they are not retried), e.g.
    RLRUN_RETRY_DEFAULT='{"max_attempts": 3, "on": ["node_lost"], "backoff_s": 60}'."""
    retry_max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    """The most attempts a run may make, the first included."""
    team_retry_max_attempts: dict[str, int] = Field(default_factory=dict)
    """The same per team ("*": every team not named), e.g.
    RLRUN_TEAM_RETRY_MAX_ATTEMPTS='{"vision": 5}'."""
    tiny_grpo_checkpoint_root: str = ""
    """Where tiny-grpo runs keep their checkpoints (``save_every``), each in <root>/<run id>,
    and their rollout samples, in <root>/<run id>/rollout-samples, on the nodes (empty:
    rlrun-<uid>-runs/tiny-grpo-checkpoints in this machine's temp dir)."""


class StopSettings(Section):
    """Stops at the next checkpoint: how long a caller may let one wait, and deadlines."""

    heading: ClassVar[str] = "Stops and deadlines"

    max_stop_within_s: float = Field(default=7 * 86400, gt=0)
    """The longest a stop at the next checkpoint may wait for it (``within_s`` of a cancel)."""
    default_stop_within_s: float = Field(default=1800, gt=0)
    """How long a stop at the next checkpoint waits when the cancel does not say."""
    deadline_margin_s: float = Field(default=300, ge=0)
    """How long before its deadline a run is asked to stop at its next checkpoint; a run that
    saves less often is asked one save interval (its longest yet, times 1.5) before."""
    team_max_duration_s: dict[str, float] = Field(default_factory=dict)
    """Longest an attempt of a team's runs may last, counted from admission ("*": every team
    not named), e.g. RLRUN_TEAM_MAX_DURATION_S='{"nlp": 86400}'; a spec's ``max_duration_s``
    may ask for less, never more."""
