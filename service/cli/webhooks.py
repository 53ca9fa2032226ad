"""Webhooks: run events to a URL, signed (``rlrun webhook``)."""

from __future__ import annotations

import re
import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from service.cli.common import clean, connect, console, emit_json, errors, say
from service.cli.options import Output, OutputOpt, ServerOpt, TokenOpt

webhook_app = typer.Typer(help="Webhooks: run events to a URL, signed.", no_args_is_help=True)


@webhook_app.command("add")
def webhook_add(
    url: Annotated[str, typer.Argument(help="Where to send (https, or an allowed address)")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            help=(
                "run.status, run.health, run.failed, run.retrying or metric.threshold "
                "(repeat for more)"
            ),
        ),
    ] = None,
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            help="metric.threshold rule 'KEY OP VALUE [for N]', e.g. "
            "'critic/score/mean < 0.1 for 20' (repeat for more)",
        ),
    ] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="run.status only for this status")
    ] = None,
    name_pattern: Annotated[str | None, typer.Option(help="Only runs named like this glob")] = None,
    recipe: Annotated[str | None, typer.Option(help="Only runs of this recipe")] = None,
    slack: Annotated[bool, typer.Option("--slack", help="Send Slack messages")] = False,
    team: Annotated[str | None, typer.Option(help="An admin's: this team (default all)")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Subscribe URL to run events; prints the signing secret, which is shown only now."""
    subscription: dict[str, Any] = {
        "url": url,
        "events": event or ["run.status"],
        "statuses": status or [],
        "format": "slack" if slack else "standard",
    }
    optional = {"name_pattern": name_pattern, "recipe": recipe, "team": team}
    subscription |= {k: v for k, v in optional.items() if v is not None}
    if threshold:
        subscription["thresholds"] = [_threshold_rule(t) for t in threshold]
        if "metric.threshold" not in subscription["events"]:
            subscription["events"] = [*(event or []), "metric.threshold"]
    with connect(server, token) as client:
        hook = client.create_webhook(subscription)
    if output == Output.json:
        emit_json(hook)
        return
    sys.stdout.write(hook["id"] + "\n")
    say(f"secret (shown once): {hook['secret']}", to=errors)


_RULE = re.compile(r"^\s*(\S+?)\s*(<=|>=|<|>)\s*(\S+?)(?:\s+for\s+(\d+))?\s*$")


def _threshold_rule(text: str) -> dict[str, Any]:
    """``critic/score/mean < 0.1 for 20`` as the API's rule (the service validates it)."""
    found = _RULE.match(text)
    if found is None:
        why = f"{text!r} is not 'KEY OP VALUE [for N]'"
        raise typer.BadParameter(why, param_hint="--threshold")
    key, op, value, steps = found.groups()
    return {"key": key, "op": op, "value": value, "for_steps": int(steps or 1)}


@webhook_app.command("list")
def webhook_list(
    server: ServerOpt = None, token: TokenOpt = None, output: OutputOpt = Output.table
) -> None:
    """Subscriptions you may see (no secrets)."""
    with connect(server, token) as client:
        hooks = client.webhooks()
    if output == Output.json:
        emit_json(hooks)
        return
    table = Table("id", "team", "url", "events", "format", "paused", "last", "failures")
    for h in hooks:
        last = h["last_attempt"]
        table.add_row(
            Text(h["id"]),
            Text(clean(h["team"] or "(all)")),
            Text(clean(h["url"])),
            Text(",".join(h["events"])),
            Text(h["format"]),
            Text(clean(h["paused_reason"] or "") if h["paused_at"] else ""),
            Text(str(last["status_code"] or "error") if last else "-"),
            Text(str(h["failures"])),
        )
    console.print(table)


@webhook_app.command("edit")
def webhook_edit(
    hook_id: str,
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            help="metric.threshold rule 'KEY OP VALUE [for N]' (repeat for more): these replace "
            "the subscription's rules",
        ),
    ] = None,
    no_thresholds: Annotated[
        bool,
        typer.Option("--no-thresholds", help="Drop every rule (and the metric.threshold event)"),
    ] = False,
    paused: Annotated[
        bool | None, typer.Option("--pause/--resume", help="Stop or restart its deliveries")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change a subscription's threshold rules, or pause or resume it; the rest stays."""
    if threshold and no_thresholds:
        raise typer.BadParameter("give --threshold or --no-thresholds, not both")
    changes: dict[str, Any] = {} if paused is None else {"paused": paused}
    with connect(server, token) as client:
        if threshold or no_thresholds:
            events = [e for e in client.webhook(hook_id)["events"] if e != "metric.threshold"]
            rules = [_threshold_rule(t) for t in threshold or []]
            changes |= {
                "thresholds": rules,
                "events": [*events, "metric.threshold"] if rules else events,
            }
        if not changes:
            raise typer.BadParameter(
                "nothing to change: give --threshold, --no-thresholds, --pause or --resume"
            )
        hook = client.update_webhook(hook_id, changes)
    if output == Output.json:
        emit_json(hook)
        return
    shown = "; ".join(
        f"{r['key']} {r['op']} {r['value']:g} for {r['for_steps']}" for r in hook["thresholds"]
    )
    state = "paused" if hook["paused_at"] else "active"
    say(f"{hook['id']}: {','.join(hook['events'])}; {shown or 'no threshold rules'}; {state}")


@webhook_app.command("rm")
def webhook_rm(hook_id: str, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Delete a subscription (deliveries not yet sent go with it)."""
    with connect(server, token) as client:
        client.delete_webhook(hook_id)
    say(f"deleted {hook_id}")
