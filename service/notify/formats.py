"""The bodies a delivery is sent as: the Standard Webhooks JSON, or a Slack message."""

from __future__ import annotations

import json
from typing import Any

from service.store.models import WebhookDelivery


def body(delivery: WebhookDelivery, fmt: str, dashboard_url: str) -> bytes:
    """The bytes sent for ``delivery``: the same on every attempt (the signature covers them)."""
    link = f"{dashboard_url.rstrip('/')}/#/runs/{delivery.payload['run']['id']}"
    if fmt == "slack":
        doc = slack(delivery.event_type, delivery.payload, link)
    else:
        doc = {
            "type": delivery.event_type,
            "timestamp": delivery.created_at.isoformat(),
            "data": delivery.payload | {"url": link},
        }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def headline(event_type: str, payload: dict[str, Any]) -> str:
    run = payload["run"]
    if event_type == "metric.threshold":
        t, rule = payload["threshold"], payload["threshold"]["rule"]
        shown = f"{t['value']:.4g}" if isinstance(t["value"], float | int) else t["value"]
        return (
            f"{t['key']} = {shown} at step {t['step']} "
            f"({rule['op']} {rule['value']:g} for {rule['for_steps']} steps)"
        )
    event = payload["event"]
    if event_type == "run.health":
        return f"health {run['health']}: {event['reason']}"
    if event_type == "run.grant_replayed":
        return f"secrets grant presented again: {event['reason']}"
    if event_type in ("run.checkpoint", "run.stop_requested"):
        return str(event["reason"])
    if event_type == "run.retrying":
        return f"attempt {payload['attempt']}: {event['reason']}"
    if event_type == "run.attempt_ended":
        attempt, after = payload["attempt"], payload.get("next_attempt")
        cls = f" ({attempt['failure']['class']})" if attempt.get("failure") else ""
        then = f"attempt {after} follows" if after else "no attempt follows"
        return f"attempt {attempt['n']} {attempt['status']}{cls}: {then}"
    if event_type == "run.failed" and payload.get("failure"):
        failure = payload["failure"]
        return f"FAILED ({failure['class']}): {failure['summary']}"
    return f"{event['from']} → {event['to']}: {event['reason']}"


def slack(event_type: str, payload: dict[str, Any], link: str) -> dict[str, Any]:
    """A Slack incoming-webhook message (``text`` for notifications, ``blocks`` to show)."""
    run = payload["run"]
    what = headline(event_type, payload)
    name = _escape(run["name"])
    return {
        "text": f"rlrun: {name}: {_escape(what)}",
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*<{link}|{name}>*\n{_escape(what)}"},
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"team {_escape(run['team'])} · {_escape(run['recipe'])} · "
                        f"`{run['id']}` · {event_type}",
                    }
                ],
            },
        ],
    }


def _escape(text: str) -> str:
    """Slack's mrkdwn escapes: a run's name cannot open a link or mention a channel."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
