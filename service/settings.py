"""Service settings, read once from the environment (prefix ``RLRUN_``)."""

from __future__ import annotations

import ipaddress
import os
import tempfile
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.client import DEFAULT_PORT


class Settings(BaseSettings):
    """Everything a deployment configures by name; built once and handed to ``create_app``."""

    model_config = SettingsConfigDict(env_prefix="RLRUN_", extra="ignore")

    database_url: str = "sqlite:///rlrun.db"
    # The longest anything waits for the database (a turn to write, a pooled connection, a
    # lock); past it a request answers 503 with Retry-After. The pool serves the request
    # threads, the background loops (4) and the live event streams' reads.
    db_wait_s: float = 5.0
    db_pool_size: int = 20
    db_max_overflow: int = 30
    # How long an answer of GET /runs/{id} or GET /runs may be served again without reading
    # the database.
    # This replica's own writes refresh it at once, so only another replica's write can go
    # unseen, and for no longer than this. 0: every read reads the database.
    read_cache_s: float = Field(default=1.0, ge=0)
    # Worker threads for requests. Python runs one at a time: more only add waiting for the
    # interpreter lock, the event loop's included (it answers /healthz and live streams).
    request_threads: int = 8
    # Requests waiting for their answer (for a thread included) past which new ones get a 503
    # with Retry-After at once, so that the admitted ones never wait long (/healthz: never).
    max_requests_in_progress: int = 128
    # Liveness and readiness on a listener of their own (a thread and port apart from the
    # API's), which a flood of API calls cannot delay; unset: only on the API's port. Host:
    # ``listen_host`` unless set. Liveness fails when the API's event loop has been silent
    # this long (blocked, not merely busy).
    probe_port: int | None = Field(default=None, ge=0, le=65535)
    probe_host: str | None = None
    probe_stall_s: float = Field(default=30.0, gt=0)
    # SIGTERM: live event streams end at once; other requests get this long to finish.
    shutdown_grace_s: float = 10.0
    # "local": start an embedded Ray head; otherwise the dashboard address of a cluster.
    ray_address: str = "local"
    ray_token: str | None = Field(default=None, description="Bearer token for a token-auth head")
    ray_timeout_s: float = 10.0
    # Virtual NPUs per local node, e.g. "16" or "8,8" for two nodes.
    local_npus: str = "16"
    local_cpus_per_node: int = 16
    # Ray keeps sockets here: the path must stay short (default: a fresh dir under /tmp).
    local_ray_dir: str | None = None
    # Unset: free ports chosen at start. Given but in use: the service refuses to start.
    local_ray_port: int | None = None
    local_dashboard_port: int | None = None
    # Where the local nodes' process groups are recorded, so that the next start clears nodes
    # a killed service left running (default: rlrun-<uid> in the system temp dir).
    local_ray_state_dir: str | None = None

    submit_interval_s: float = 1.0
    reconcile_interval_s: float = 2.0
    claim_ttl_s: float = Field(default=60.0, description="A replica's hold on a run it submits")
    submit_batch: int = 16
    max_backoff_s: float = 30.0
    run_loops: bool = True
    migrate_on_start: bool = True
    # Extra recipes: comma-separated "module:function" entries, each called with the registry.
    recipe_plugins: str = ""

    # Grace period between SIGTERM and SIGKILL when a run is stopped (time to checkpoint).
    stop_grace_s: int = 120
    max_body_bytes: int = 1_000_000
    # A request body not fully arrived this long after its headers: 408 (and the connection
    # closed). Until it is in, a request holds no slot of max_requests_in_progress.
    body_timeout_s: float = Field(default=10.0, gt=0)

    # Metrics: the log follower, its lease, the kept log copy, health from metrics, live stream.
    follow_interval_s: float = 1.0
    follower_lease_s: float = 15.0
    # Runs no replica follows yet that one replica starts following per tick (replicas started
    # together share them); runs of a replica whose lease lapsed are all taken at once.
    follower_claim_new: int = Field(default=100, ge=1)
    log_keep_chars: int = 8_000_000
    stall_after_s: float = Field(
        default=600.0, description="Health stalled: a RUNNING run logs no new step this long"
    )
    collapse_window: int = 20
    collapse_patience: int = 3
    collapse_drop: float = 0.5
    events_poll_s: float = 1.0

    @field_validator("local_npus")
    @classmethod
    def _npus_are_counts(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError("expected comma-separated NPU counts per node, e.g. '16' or '8,8'")
        return ",".join(parts)

    @property
    def local_npus_per_node(self) -> list[int]:
        return [int(p) for p in self.local_npus.split(",")]

    @property
    def local_ray_state_path(self) -> Path:
        default = Path(tempfile.gettempdir()) / f"rlrun-{os.getuid()}"
        return Path(self.local_ray_state_dir) if self.local_ray_state_dir else default

    @property
    def uses_local_ray(self) -> bool:
        return self.ray_address == "local"

    # verl fully async recipe: absolute dirs on the cluster nodes for data, models and
    # checkpoints (each run gets <root>/<run id>), and the logger backends needing credentials
    # (e.g. "wandb,mlflow") that the cluster has set up; others are left out of presets.
    verl_data_dir: str = "/data"
    verl_model_dir: str = "/models"
    verl_checkpoint_root: str = "/checkpoints"
    verl_loggers_configured: str = ""
    # Where else a spec's paths may point, read-only in intent (absolute dirs on the nodes, or
    # URI prefixes such as "hdfs://namenode/datasets"), besides the data and model dirs above.
    # Checkpoints: only the run's own directory, whatever is listed here.
    data_roots: list[str] = Field(default_factory=list)

    # The preflight the verl launcher runs on every node before verl starts: the packages the
    # nodes must carry ("auto": verl at the validated version, transformers in verl's own range,
    # the accelerator's torch/vllm stack installed; or a comma-separated list of requirements such
    # as "torch-npu==2.10.0.post4,vllm-ascend==0.23.0", verl's pin always added), whether Ray's
    # accelerators must be real device files (off for virtual NPUs), and how long nodes may take.
    preflight_packages: str = "auto"
    # Where `rlrun verl add X` unpacks other verl versions specs may name (`verl_version`).
    verl_cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "rlrun" / "verl")
    )
    # The package index's JSON API `rlrun verl add` takes a wheel's SHA-256 from (PyPI's
    # <url>/<project>/json); pip downloads from its own configured index.
    verl_index_json_url: str = "https://pypi.org/pypi"
    preflight_check_devices: bool = True
    preflight_timeout_s: float = 60.0

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

    @property
    def verl_credentialed_loggers(self) -> list[str]:
        return [p.strip() for p in self.verl_loggers_configured.split(",") if p.strip()]

    # Admission and stuck runs. Quotas cap the accelerators a team holds at once, e.g.
    # RLRUN_TEAM_QUOTAS='{"vision": 16}'; teams not listed get the default (None: unlimited).
    team_quotas: dict[str, int] = Field(default_factory=dict)
    default_team_quota: int | None = None
    # How long the cluster inventory read from Ray is reused by the API.
    inventory_ttl_s: float = 3.0
    # A submitted run not RUNNING after this long, or a RUNNING one silent this long, is stuck.
    stuck_submitted_s: float = 600.0
    stuck_silent_s: float = 1800.0
    stop_stuck: bool = False
    watchdog_interval_s: float = 10.0
    # Jobs on the cluster that are no runs of the service are stopped this long after Ray started
    # them, each with an audit row (None: never; they are shown and counted all the same).
    stop_unmanaged_after_s: float | None = Field(default=None, ge=0)
    # Nodes per team: team -> node group, a Ray custom resource the group's nodes carry, e.g.
    # RLRUN_TEAM_NODES='{"vision": "group-a", "*": "shared"}' ("*": every team not named).
    team_nodes: dict[str, str] = Field(default_factory=dict)

    # Webhooks: where they may call besides public addresses (host names or CIDRs, comma
    # separated, e.g. "127.0.0.1/32,hooks.internal"), how often the outbox is read, how long
    # a receiver may take, the first retry's delay and how long a delivery is retried.
    webhook_allow: str = ""
    webhook_interval_s: float = Field(default=0.5, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    webhook_retry_s: float = Field(default=5.0, gt=0)
    webhook_max_age_s: float = Field(default=24 * 3600.0, gt=0)

    # Identity. "auto": on unless the service listens only on loopback (``listen_host``, set by
    # ``rlrun serve --host``); "on"; "off" (open: every caller is an anonymous admin).
    auth: Literal["auto", "on", "off"] = "auto"
    listen_host: str = "127.0.0.1"
    # Proxies whose X-Forwarded-For/-Proto are believed (uvicorn's forwarded_allow_ips: IPs or
    # networks, comma-separated, "*" any): the client address of audit rows. Empty: none, the
    # socket's peer is the client.
    forwarded_allow_ips: str = ""
    # Teams whose members may submit priority "high" (admins always may).
    high_priority_teams: list[str] = Field(default_factory=list)
    # Hosts the service answers for (Host header); "*" answers any.
    allowed_hosts: list[str] = Field(default_factory=lambda: ["*"])
    # Open mode answers only for loopback Host names (127.0.0.1, localhost, [::1]), these, and
    # the names allowed_hosts lists (exact names; its "*" patterns do not count).
    open_mode_hosts: list[str] = Field(default_factory=list)

    # OpenID Connect: bearer JWTs of an identity provider, beside API tokens. On when issuer and
    # audience are both set. Keys come from the JWKS URL, or else from the provider's discovery
    # document (<issuer>/.well-known/openid-configuration). Only public-key algorithms. The user
    # is "sub" by default: the one claim OIDC makes stable and unique per issuer (an email may
    # change hands or be absent from access tokens).
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_algorithms: str = "RS256,ES256"
    oidc_user_claim: str = Field(default="sub", min_length=1)
    oidc_team_claim: str = Field(default="team", min_length=1)
    oidc_role_claim: str = Field(default="role", min_length=1)
    oidc_leeway_s: float = Field(default=30.0, ge=0, le=300)

    # Secrets a spec names by reference: files <dir>/teams/<team>/<name> or <dir>/shared/<name>,
    # or env vars RLRUN_SECRET_<NS>__<NAME> / RLRUN_SHARED_SECRET_<NAME> (service.team_secrets).
    secrets_dir: str | None = None
    # The service's URL as the cluster and people reach it: a job redeems its secrets grant
    # there, webhook messages link there (unset: http://<listen host>:<listen port>, loopback
    # for a wildcard host).
    public_url: str | None = None
    listen_port: int = DEFAULT_PORT
    # How long a job has to redeem its grant after it is submitted (its runtime env set up,
    # pip included); a redeemed grant, or one whose run is over, is refused sooner.
    grant_ttl_s: float = Field(default=3600.0, gt=0, le=86_400)

    # What a spec may ask of the cluster, widened only here: env var names exempt from the
    # deny-list, and Hydra keys (prefixes) an override may set although refused by default.
    env_allow: list[str] = Field(default_factory=list)
    override_allow: list[str] = Field(default_factory=list)

    # Limits: accepted runs per team per minute (0: none), live event streams per caller,
    # metric keys per request, rows per page of /cluster.
    runs_per_team_per_minute: int = Field(default=120, ge=0)
    streams_per_caller: int = Field(default=16, ge=1)
    # Specs one caller may have validated at once (dry runs and submissions); one more is a 429.
    validations_per_caller: int = Field(default=2, ge=1)
    metric_keys_per_request: int = Field(default=200, ge=1)
    cluster_list_limit: int = Field(default=500, ge=1)
    # What one run may store: distinct metric keys (verl logs a few hundred; past the limit only
    # new keys are dropped) and points (100 keys x 200,000 steps: about 2.5 GiB on SQLite and
    # 5 GiB on PostgreSQL at the measured bytes per point; past it nothing more is stored).
    metric_keys_per_run: int = Field(default=2_000, ge=1)
    metric_points_per_run: int = Field(default=20_000_000, ge=1)

    @field_validator("oidc_issuer", "oidc_audience", "oidc_jwks_url")
    @classmethod
    def _oidc_names(cls, value: str | None, info: ValidationInfo) -> str | None:
        value = (value or "").strip() or None
        if value and info.field_name != "oidc_audience" and not is_secure_url(value):
            raise ValueError("expected an https:// URL (http:// only on loopback)")
        return value

    @field_validator("oidc_algorithms")
    @classmethod
    def _public_key_algorithms(cls, value: str) -> str:
        names = [p.strip() for p in value.split(",") if p.strip()]
        if not names:
            raise ValueError("expected at least one algorithm, e.g. 'RS256,ES256'")
        for name in names:
            if name not in PUBLIC_KEY_ALGORITHMS:
                raise ValueError(
                    f"{name!r} is not accepted: only public-key algorithms verify a provider's "
                    f"tokens ({', '.join(PUBLIC_KEY_ALGORITHMS)})"
                )
        return ",".join(names)

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

    @model_validator(mode="after")
    def _oidc_complete(self) -> Settings:
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

    @property
    def oidc_algorithm_list(self) -> list[str]:
        return self.oidc_algorithms.split(",")

    @property
    def open_mode_host_names(self) -> list[str]:
        named = [h for h in self.allowed_hosts if "*" not in h]
        return [*self.open_mode_hosts, *named]

    @property
    def auth_enabled(self) -> bool:
        if self.auth != "auto":
            return self.auth == "on"
        return not is_loopback(self.listen_host)


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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
