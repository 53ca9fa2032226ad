"""Service settings, read once from the environment (prefix ``RLRUN_``).

Grouped in sections, one small class each (its fields, what each means in the docstring under
it); ``Settings`` composes them, so every setting keeps its flat name (``RLRUN_RAY_ADDRESS``,
``settings.ray_address``). A new setting goes into the section it belongs to; the settings page
of the docs is generated from the sections (``python -m tests.docs_reference``). A list setting
is given as a JSON list or as items separated by commas. A credential is a ``SecretStr``: shown
masked in any repr, dump or log, its value read (``get_secret_value()``) where it is used.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.client import DEFAULT_PORT
from service.recovery.policy import MAX_ATTEMPTS, RetryPolicy


def _items(value: object) -> object:
    """A list setting as given: a JSON list (``'["a", "b"]'``), or items separated by commas
    (``a,b``; spaces around them and empty ones dropped; ``[::1],localhost`` is two items)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            if '"' in text:  # meant as JSON: its error, not a guess
                raise
    return [item.strip() for item in text.split(",") if item.strip()]


# Every list setting is one of these: read raw from the environment (NoDecode), then ``_items``.
Names = Annotated[list[str], NoDecode, BeforeValidator(_items)]
Counts = Annotated[list[NonNegativeInt], NoDecode, BeforeValidator(_items)]


class Section(BaseModel):
    """A group of settings (a table of the docs' settings page, under ``heading``); the
    docstring under each field is its description."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    heading: ClassVar[str] = ""


class DatabaseSettings(Section):
    """The database every replica shares: runs, metrics, audit rows and tokens."""

    heading: ClassVar[str] = "Database"

    database_url: SecretStr = SecretStr("sqlite:///rlrun.db")
    """SQLAlchemy URL of the database (SQLite file or ``postgresql+psycopg://``); a secret, as
    it may carry a password."""
    db_wait_s: float = 5.0
    """The longest anything waits for the database (a turn to write, a pooled connection, a
    lock); past it a request answers 503 with Retry-After."""
    db_pool_size: int = 20
    """Connections kept open. The pool serves the request threads, the background loops (4)
    and the live event streams' reads. On PostgreSQL the reads awaited on the event loop (a
    run's page, a token's sign-in) have a pool of their own: at most the smaller of this and
    16 connections, 4 of them made at start and kept."""
    db_max_overflow: int = 30
    """Connections opened past the pool's size at a peak, closed when returned."""
    read_cache_s: float = Field(default=1.0, ge=0)
    """How long an answer of GET /runs/{id} or GET /runs may be served again without reading
    the database. Writes refresh it at once: this replica's, and on PostgreSQL another replica's
    (told by NOTIFY); only one whose notification was lost, or on SQLite another process's, can
    go unseen, and for no longer than this. 0: every read reads the database."""
    migrate_on_start: bool = True
    """Upgrade the schema at start (else ``rlrun migrate`` does)."""


class ServerSettings(Section):
    """The HTTP server: where it listens, how it is reached, how much it takes at once."""

    heading: ClassVar[str] = "HTTP server"

    listen_host: str = "127.0.0.1"
    """The address the API listens on (set by ``rlrun serve --host``)."""
    listen_port: int = DEFAULT_PORT
    """The API's port (set by ``rlrun serve --port``)."""
    public_url: str | None = None
    """The service's URL as the cluster and people reach it: a job redeems its secrets grant
    there, webhook messages link there (unset: http://<listen host>:<listen port>, loopback for
    a wildcard host)."""
    request_threads: int = 32
    """Worker threads for requests. Python runs one at a time, but a thread waiting for the
    database runs none: accepts that wait while one commits are stored together, so more
    threads make fuller transactions. At 64 clients on PostgreSQL, 32 accepted 40 % more than
    8 (64 more again), and reads made meanwhile were answered twice as fast (the door lets
    twice this many requests in: see ``max_request_wait_s``); 64 slowed those reads again."""
    max_requests_in_progress: int = 128
    """Requests waiting for their answer (for a thread included) past which new ones get a 503
    with Retry-After at once, so that the admitted ones never wait long (/healthz: never)."""
    max_request_wait_s: float = Field(default=2.0, gt=0)
    """The longest a request waits to be started (twice request_threads are in at a time);
    past it, a 503 with Retry-After instead of a late answer."""
    access_log: bool = False
    """A line per request on the server's log (uvicorn's access log). Off by default: at
    hundreds of requests a second it costs a tenth of a request's time, and the audit trail
    (every write, with its caller), the request metrics (/metrics) and a proxy's own log
    already tell who asked what."""
    shutdown_grace_s: float = 10.0
    """SIGTERM: live event streams end at once; other requests get this long to finish."""
    allowed_hosts: Names = ["*"]
    """Hosts the service answers for (Host header); "*" answers any."""
    forwarded_allow_ips: Names = []
    """Proxies whose X-Forwarded-For/-Proto are believed (uvicorn's forwarded_allow_ips: IPs or
    networks, "*" any): the client address of audit rows. Empty: none, the
    socket's peer is the client."""
    probe_port: int | None = Field(default=None, ge=0, le=65535)
    """Liveness and readiness on a listener of their own (a thread and port apart from the
    API's), which a flood of API calls cannot delay; unset: only on the API's port."""
    probe_host: str | None = None
    """The probe listener's address (unset: ``listen_host``)."""
    probe_stall_s: float = Field(default=30.0, gt=0)
    """Liveness fails when the API's event loop has been silent this long (blocked, not merely
    busy)."""

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        value = (value or "").strip().rstrip("/") or None
        if value is None:
            return None
        try:
            parts = urlsplit(value)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError("expected the service's http(s):// URL as the cluster reaches it")
        if "$" in value or any(c.isspace() for c in value) or parts.query or parts.fragment:
            raise ValueError("expected a plain URL: no '$', spaces, query or fragment")
        return value

    @property
    def service_url(self) -> str:
        """The service as the cluster and people reach it (``public_url`` or derived)."""
        if self.public_url:
            return self.public_url
        host = self.listen_host
        if host in {"", "0.0.0.0", "::", "[::]"}:
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.listen_port}"


class RaySettings(Section):
    """The Ray cluster runs go to."""

    heading: ClassVar[str] = "Ray"

    ray_address: str = "local"
    """"local": start an embedded Ray head; otherwise the dashboard address of a cluster."""
    ray_token: SecretStr | None = None
    """Bearer token for a token-auth head."""
    ray_timeout_s: float = 10.0
    """The longest one call to Ray's Jobs API may take."""
    inventory_ttl_s: float = 3.0
    """How long the cluster inventory read from Ray is reused by the API."""
    clusters_file: str | None = None
    """A YAML file declaring several Ray clusters (see the clusters page); unset: one cluster,
    ``default``, at RLRUN_RAY_ADDRESS."""
    cluster_down_after_s: float = Field(default=6.0, gt=0)
    """With a clusters file: a cluster is marked down once every probe of its head failed for
    this long (two at least), and its active runs end LOST or are retried elsewhere. Shorter
    than this, a Ray timeout or a blip downs nothing."""
    cluster_probe_interval_s: float = Field(default=1.0, gt=0)
    """With a clusters file: how often each cluster's head is probed (each probe waits at most
    twice this)."""

    @property
    def uses_local_ray(self) -> bool:
        return self.ray_address == "local"


class LocalClusterSettings(Section):
    """The embedded Ray head ``RLRUN_RAY_ADDRESS=local`` starts, with virtual NPUs."""

    heading: ClassVar[str] = "Local Ray cluster"

    local_npus: Counts = Field(default=[16], min_length=1)
    """Virtual NPUs per local node, e.g. "16" or "8,8" for two nodes."""
    local_cpus_per_node: int = 16
    """CPUs each local node offers."""
    local_ray_dir: str | None = None
    """Ray keeps sockets here: the path must stay short (default: a fresh dir under /tmp)."""
    local_ray_port: int | None = None
    """The head's GCS port. Unset: free ports chosen at start. Given but in use: the service
    refuses to start."""
    local_dashboard_port: int | None = None
    """The head's dashboard (Jobs API) port; unset or in use as for ``local_ray_port``."""
    local_ray_state_dir: str | None = None
    """Where the local nodes' process groups are recorded, so that the next start clears nodes
    a killed service left running (default: rlrun-<uid> in the system temp dir)."""

    @property
    def local_ray_state_path(self) -> Path:
        default = Path(tempfile.gettempdir()) / f"rlrun-{os.getuid()}"
        return Path(self.local_ray_state_dir) if self.local_ray_state_dir else default


class AuthSettings(Section):
    """Identity: API tokens, open mode, and OpenID Connect.

    OIDC accepts bearer JWTs of an identity provider beside API tokens; it is on when issuer and
    audience are both set. Keys come from the JWKS URL, or else from the provider's discovery
    document (<issuer>/.well-known/openid-configuration). Only public-key algorithms."""

    heading: ClassVar[str] = "Authentication"

    auth: Literal["auto", "on", "off"] = "auto"
    """"auto": on unless the service listens only on loopback (``listen_host``, set by
    ``rlrun serve --host``); "on"; "off" (open: every caller is an anonymous admin)."""
    signin_cache_s: float = Field(default=1.0, ge=0)
    """How long an API token that signed in is trusted again without reading the database. A
    revocation ends it at once on the replica that made it and, on PostgreSQL, on the others
    (told by NOTIFY); ``rlrun token revoke`` answers once this long has passed, so that the
    token is refused everywhere. 0: every request reads its token."""
    open_mode_hosts: Names = []
    """Open mode answers only for loopback Host names (127.0.0.1, localhost, [::1]), these, and
    the names allowed_hosts lists (exact names; its "*" patterns do not count)."""
    oidc_issuer: str | None = None
    """The provider's issuer URL (the tokens' "iss")."""
    oidc_audience: str | None = None
    """The audience the tokens must name ("aud")."""
    oidc_jwks_url: str | None = None
    """Where the provider's keys are (unset: from its discovery document)."""
    oidc_algorithms: Names = ["RS256", "ES256"]
    """Signature algorithms accepted (public-key ones only)."""
    oidc_user_claim: str = Field(default="sub", min_length=1)
    """The claim naming the user: "sub" by default, the one claim OIDC makes stable and unique
    per issuer (an email may change hands or be absent from access tokens)."""
    oidc_team_claim: str = Field(default="team", min_length=1)
    """The claim naming the caller's team."""
    oidc_role_claim: str = Field(default="role", min_length=1)
    """The claim naming the caller's role."""
    oidc_leeway_s: float = Field(default=30.0, ge=0, le=300)
    """Clock skew allowed on a token's times (exp, nbf, iat)."""

    @field_validator("oidc_issuer", "oidc_audience", "oidc_jwks_url")
    @classmethod
    def _oidc_names(cls, value: str | None, info: ValidationInfo) -> str | None:
        value = (value or "").strip() or None
        if value and info.field_name != "oidc_audience" and not is_secure_url(value):
            raise ValueError("expected an https:// URL (http:// only on loopback)")
        return value

    @field_validator("oidc_algorithms")
    @classmethod
    def _public_key_algorithms(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("expected at least one algorithm, e.g. 'RS256,ES256'")
        for name in names:
            if name not in PUBLIC_KEY_ALGORITHMS:
                raise ValueError(
                    f"{name!r} is not accepted: only public-key algorithms verify a provider's "
                    f"tokens ({', '.join(PUBLIC_KEY_ALGORITHMS)})"
                )
        return names

    @model_validator(mode="after")
    def _oidc_complete(self) -> AuthSettings:
        if (self.oidc_issuer is None) != (self.oidc_audience is None):
            raise ValueError(
                "RLRUN_OIDC_ISSUER and RLRUN_OIDC_AUDIENCE go together: both turn OIDC on, "
                "neither leaves it off"
            )
        if self.oidc_jwks_url and not self.oidc_enabled:
            raise ValueError("RLRUN_OIDC_JWKS_URL needs RLRUN_OIDC_ISSUER and RLRUN_OIDC_AUDIENCE")
        if self.oidc_enabled and self.auth == "off":
            raise ValueError("OIDC is configured but RLRUN_AUTH=off would let every caller in")
        return self

    @property
    def oidc_enabled(self) -> bool:
        return self.oidc_issuer is not None and self.oidc_audience is not None


class SecretSettings(Section):
    """Secrets a spec names by reference, and the grant a job redeems them with."""

    heading: ClassVar[str] = "Secrets and grants"

    secrets_dir: str | None = None
    """Files <dir>/teams/<team>/<name> or <dir>/shared/<name>; besides them, env vars
    RLRUN_SECRET_<NS>__<NAME> / RLRUN_SHARED_SECRET_<NAME> (service.team_secrets)."""
    grant_ttl_s: float = Field(default=3600.0, gt=0, le=86_400)
    """How long a job has to redeem its grant after it is submitted (its runtime env set up,
    pip included); a redeemed grant, or one whose run is over, is refused sooner."""


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
    """Where tiny-grpo runs that checkpoint (``save_every``) keep them, each in
    <root>/<run id>, on the nodes (empty: rlrun-<uid>/tiny-grpo-checkpoints in this machine's
    temp dir)."""


class MetricsSettings(Section):
    """Metrics: the log follower, its lease, the kept log copy, health from metrics, live
    streams."""

    heading: ClassVar[str] = "Metrics and live streams"

    follow_interval_s: float = 1.0
    """How often active runs' logs are read."""
    follower_lease_s: float = 15.0
    """A replica's hold on the runs it follows; past it another replica takes them."""
    follower_claim_new: int = Field(default=100, ge=1)
    """Runs no replica follows yet that one replica starts following per tick (replicas started
    together share them); runs of a replica whose lease lapsed are all taken at once."""
    log_keep_chars: int = 8_000_000
    """Characters of a run's log kept in the database (the newest)."""
    stall_after_s: float = 600.0
    """Health stalled: a RUNNING run logs no new step this long."""
    collapse_window: int = 20
    """Health collapsed: the newest rewards whose best the last ones are measured against."""
    collapse_patience: int = 3
    """Health collapsed: the last this many rewards all below (1 - collapse_drop) x the best
    of the window."""
    collapse_drop: float = 0.5
    """Health collapsed: the fraction of the window's best reward lost."""
    events_poll_s: float = 1.0
    """How often live streams look for another replica's writes (on PostgreSQL its status
    events come at once, told by NOTIFY; its metric lines at this poll)."""
    signal_window: int = Field(default=10, ge=2)
    """Health from verl's fully async metrics (staleness drift, a growing weight sync, idle
    imbalance): the steps each signal reads."""
    idle_gap: float = Field(default=0.3, gt=0, le=1)
    """Health idle_imbalance: how far apart the trainer's and the rollouter's mean idle ratio
    over the window may be."""
    signal_growth: float = Field(default=1.5, gt=1)
    """Health sync_growing and staleness_drift: how many times the weight sync's time, or the
    stale trajectories per step, of the newest half-window may be those of the run's first
    window."""


class WebhookSettings(Section):
    """Webhooks: where they may call, how often, how long they are retried."""

    heading: ClassVar[str] = "Webhooks"

    webhook_allow: Names = []
    """Where webhooks may call besides public addresses: host names or CIDRs, e.g.
    "127.0.0.1/32,hooks.internal"."""
    webhook_interval_s: float = Field(default=0.5, gt=0)
    """How often the outbox is read."""
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    """How long a receiver may take."""
    webhook_retry_s: float = Field(default=5.0, gt=0)
    """The first retry's delay (doubling after)."""
    webhook_max_age_s: float = Field(default=24 * 3600.0, gt=0)
    """How long a delivery is retried."""
    webhook_claim_s: float = Field(default=50.0, gt=0)
    """A delivery claimed by a replica that died is sent again (same webhook-id) this long after
    the claim; more than twice webhook_timeout_s, so that a send still running is never
    claimed by another replica."""

    @model_validator(mode="after")
    def _claim_outlasts_a_send(self) -> WebhookSettings:
        if self.webhook_claim_s <= 2 * self.webhook_timeout_s:
            raise ValueError(
                "RLRUN_WEBHOOK_CLAIM_S must be more than twice RLRUN_WEBHOOK_TIMEOUT_S"
            )
        return self


class VerlSettings(Section):
    """The verl fully async recipe: paths on the cluster's nodes, loggers, the preflight."""

    heading: ClassVar[str] = "verl recipe"

    verl_data_dir: str = "/data"
    """Absolute dir on the cluster nodes for data."""
    verl_model_dir: str = "/models"
    """Absolute dir on the cluster nodes for models."""
    verl_checkpoint_root: str = "/checkpoints"
    """Absolute dir on the cluster nodes for checkpoints (each run gets <root>/<run id>)."""
    data_roots: Names = []
    """Where else a spec's paths may point, read-only in intent (absolute dirs on the nodes, or
    URI prefixes such as "hdfs://namenode/datasets"), besides the data and model dirs.
    Checkpoints: only the run's own directory, whatever is listed here."""
    verl_loggers_configured: Names = []
    """The logger backends needing credentials (e.g. "wandb,mlflow") that the cluster has set
    up; others are left out of presets."""
    verl_cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "rlrun" / "verl")
    )
    """Where `rlrun verl add X` unpacks other verl versions specs may name (`verl_version`);
    default: ~/.cache/rlrun/verl."""
    verl_index_json_url: str = "https://pypi.org/pypi"
    """The package index's JSON API `rlrun verl add` takes a wheel's SHA-256 from (PyPI's
    <url>/<project>/json); pip downloads from its own configured index."""
    preflight_packages: Names = ["auto"]
    """The packages the nodes must carry, checked by the launcher on every node before verl
    starts: "auto" (verl at the validated version, transformers in verl's own range, the
    accelerator's torch/vllm stack installed) or requirements such as
    "torch-npu==2.10.0.post4,vllm-ascend==0.23.0" (a JSON list for one with a comma), verl's
    pin always added."""
    preflight_check_devices: bool = True
    """The preflight checks Ray's accelerators are real device files (off for virtual NPUs)."""
    preflight_timeout_s: float = 60.0
    """How long the nodes' preflight may take."""

    @field_validator("verl_data_dir", "verl_model_dir", "verl_checkpoint_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("expected an absolute path on the cluster nodes")
        return value.rstrip("/") or "/"

    @field_validator("data_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        out = []
        for root in value:
            root = root.strip()
            if not (root.startswith("/") or "://" in root) or ".." in root.split("/"):
                raise ValueError(f"{root!r}: expected an absolute path or a URI prefix, no '..'")
            out.append(root.rstrip("/") or "/")
        return out

    @property
    def verl_data_roots(self) -> tuple[str, ...]:
        """Every root a spec's paths may point under (the run's own dir apart)."""
        return tuple(dict.fromkeys([self.verl_data_dir, self.verl_model_dir, *self.data_roots]))


class Settings(
    DatabaseSettings,
    ServerSettings,
    RaySettings,
    LocalClusterSettings,
    AuthSettings,
    SecretSettings,
    RecipeSettings,
    LimitSettings,
    AdmissionSettings,
    LoopSettings,
    RetrySettings,
    MetricsSettings,
    WebhookSettings,
    VerlSettings,
    BaseSettings,
):
    """Everything a deployment configures by name; built once and handed to ``create_app``.
    Its sections, in the order the docs show them, are its bases (``sections()``)."""

    model_config = SettingsConfigDict(env_prefix="RLRUN_", extra="ignore")

    # What follows needs settings of two sections.

    @property
    def open_mode_host_names(self) -> list[str]:
        named = [h for h in self.allowed_hosts if "*" not in h]
        return [*self.open_mode_hosts, *named]

    @property
    def auth_enabled(self) -> bool:
        if self.auth != "auto":
            return self.auth == "on"
        return not is_loopback(self.listen_host)


def sections() -> list[type[Section]]:
    """The sections ``Settings`` is made of, in order."""
    return [base for base in Settings.__bases__ if issubclass(base, Section)]


# What a provider's JWKS may sign with: asymmetric only, so a public key can never verify a MAC.
PUBLIC_KEY_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


def is_secure_url(url: str) -> bool:
    """https, or http to this machine only: keys fetched in clear text could be swapped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(host))


@functools.lru_cache(maxsize=64)
def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) reaches only this machine (kept: every
    request asks whether auth is on)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
