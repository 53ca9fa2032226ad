"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service.

Every command that talks to the service goes through ``service.client``. Exit codes: 0 done
(``--follow``: the run SUCCEEDED), 1 the followed run ended otherwise, 2 bad usage, 3 the
service refused the request (its problem is printed), 4 the service cannot be reached.

One module per command group; ``app`` is built here from their commands.
"""

import typer

from service.cli import (
    clusters,
    logs,
    runs,
    samples,
    serve,
    tokens,
    usage,
    webhooks,
    why_slow,
)
from service.cli.common import clean

__all__ = ["app", "clean"]

# Built here, from the groups' functions, in the order help lists them.
app = typer.Typer(
    help="rlrun: asynchronous RL training runs on a shared Ray cluster.", no_args_is_help=True
)
for name, command in (
    ("serve", serve.serve),
    ("migrate", serve.migrate),
    ("submit", runs.submit),
    ("list", runs.list_runs),
    ("status", runs.status),
    ("cancel", runs.cancel),
    ("retry", runs.retry),
    ("baseline", runs.baseline),
    ("logs", logs.logs),
    ("metrics", logs.metrics),
    ("why-slow", why_slow.why_slow),
    ("samples", samples.samples),
    ("script", clusters.script),
    ("cluster", clusters.cluster),
    ("usage", usage.usage_report),
):
    app.command(name)(command)
app.add_typer(clusters.verl_app, name="verl")
app.add_typer(tokens.token_app, name="token")
app.add_typer(webhooks.webhook_app, name="webhook")
