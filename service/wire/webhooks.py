"""Webhooks as the API answers them and takes their rules: a webhook, its threshold rules (a
recipe's defaults among them), a new secret, a delivery and its attempts."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.metrics.keys import REWARD_KEY

# A metric.threshold rule's comparison (``service.notify.thresholds`` evaluates it).
ThresholdOp = Literal["<", "<=", ">", ">="]


class Threshold(BaseModel):
    """Fires when ``key op value`` holds for ``for_steps`` consecutive logged steps."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200, pattern=r"^[^\s:]+$", examples=[REWARD_KEY])
    op: ThresholdOp
    value: float = Field(allow_inf_nan=False)
    for_steps: int = Field(default=1, ge=1, le=1_000_000)


class AttemptOut(BaseModel):
    at: datetime
    status_code: int | None
    latency_ms: float | None
    error: str | None


class WebhookOut(BaseModel):
    id: str
    team: str | None
    url: str = Field(
        description="in full for its maker and admins; others see its host and a masked path"
    )
    format: str
    events: list[str]
    statuses: list[str]
    recipe: str | None
    name_pattern: str | None
    thresholds: list[Threshold]
    created_by: str
    created_at: datetime
    paused_at: datetime | None
    paused_reason: str | None
    last_attempt: AttemptOut | None = Field(
        default=None, description="its newest try at sending anything (null: none yet)"
    )
    failures: int = Field(
        default=0, description="tries failed since its last 2xx answer (all, when none had one)"
    )


class NewSecret(BaseModel):
    secret: str = Field(description="shown this once: verify signatures with it")
    previous_valid_until: datetime | None = None


class NewWebhook(WebhookOut, NewSecret):
    pass


class DeliveryOut(BaseModel):
    id: str = Field(description="the webhook-id header: the same on every attempt")
    event_type: str
    run_id: str | None
    state: str
    created_at: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None
    attempts: list[AttemptOut]
