"""API tokens, straight in the database (``rlrun token``), each change with its audit row."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from service.cli.common import clean, console, emit_json, errors, say
from service.cli.options import Output, OutputOpt

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


token_app = typer.Typer(
    help="API tokens, straight in the database of RLRUN_DATABASE_URL (bootstraps the first admin)."
)


@contextmanager
def _database() -> Iterator[Any]:
    from service.settings import Settings
    from service.store.db import Database

    db = Database(Settings().database_url.get_secret_value())
    try:
        yield db
    finally:
        db.dispose()


def _audited_on_host(session: Session, action: str, target: str) -> None:
    """An audit row for a change made with the CLI straight in the database: by the host's
    user, from this host."""
    import getpass

    from service.store import audit

    audit.record(
        session,
        audit.entry(
            user=f"cli:{getpass.getuser()}",
            role="admin",
            action=action,
            client=f"cli@{socket.gethostname()}",
            target=target,
        ),
    )


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="Who the token is for")],
    team: Annotated[str, typer.Option(help="The team it acts for")],
    role: Annotated[str, typer.Option(help="viewer, member or admin")] = "member",
    output: OutputOpt = Output.table,
) -> None:
    """Make a token and print its secret (shown this once; only its hash is stored);
    --output json: {"id", "user", "team", "role", "secret"}."""
    from service.api.admin import TokenIn
    from service.store import tokens

    try:
        spec = TokenIn.model_validate({"user": user, "team": team, "role": role})
    except ValueError as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(2) from exc
    with _database() as db, db.transaction() as session:
        row, secret = tokens.create(session, spec.user, spec.team, spec.role, "rlrun token create")
        _audited_on_host(session, "token.create", f"{row.id} {row.role}@{row.team}")
    if output == Output.json:
        emit_json(
            {"id": row.id, "user": row.user, "team": row.team, "role": row.role, "secret": secret}
        )
        return
    say(f"{row.id}  {row.role}@{row.team}  {row.user}", to=errors)
    print(secret)


@token_app.command("list")
def token_list(output: OutputOpt = Output.table) -> None:
    """Every token: id, user, team, role, and when it was revoked."""
    from service.store import tokens

    rows: list[dict[str, Any]] = []
    with _database() as db, db.transaction() as session:
        cursor = None
        while page := tokens.page(session, 500, cursor):
            rows += [
                {
                    "id": t.id,
                    "user": t.user,
                    "team": t.team,
                    "role": t.role,
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in page
            ]
            cursor = page[-1].id
    if output == Output.json:
        emit_json(rows)
        return
    table = Table("id", "user", "team", "role", "created", "revoked")
    for r in rows:
        table.add_row(*(Text(clean(r[k] or "")) for k in r))
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token: once this answers, every request with it is refused (on PostgreSQL the
    replicas are told at once; the answer waits RLRUN_SIGNIN_CACHE_S, the longest any replica
    trusts a token it was not told of)."""
    from service.errors import NotFound
    from service.settings import Settings
    from service.store import tokens
    from service.store.change_feed import ChangeFeed

    try:
        with _database() as db:
            if db.engine.dialect.name == "postgresql":
                db.before_commit(ChangeFeed(db.url, lambda _change: False).publish)
            with db.transaction() as session:
                tokens.revoke(session, token_id)
                _audited_on_host(session, "token.revoke", token_id)
    except NotFound as exc:
        say(exc.detail, style="red", to=errors)
        raise typer.Exit(1) from exc
    time.sleep(Settings().signin_cache_s)
    say(f"{token_id} revoked")
