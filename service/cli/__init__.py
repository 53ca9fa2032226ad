"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service.

Every command that talks to the service goes through ``service.client``. Exit codes: 0 done
(``--follow``: the run SUCCEEDED), 1 the followed run ended otherwise, 2 bad usage, 3 the
service refused the request (its problem is printed), 4 the service cannot be reached.

One module per command group; ``app`` is built here from their commands.
"""

import typer

from service.cli import clusters, logs, runs, serve, tokens, usage, webhooks, why_slow
from service.cli.common import clean

__all__ = ["app", "clean"]

# Built here, from the groups' functions, in the order help lists them.
app = typer.Typer(
    help="rlrun: asynchronous RL training runs on a shared Ray cluster.", no_args_is_help=True
)
app.command()(serve.serve)
app.command()(serve.migrate)
app.command()(runs.submit)
app.command("list")(runs.list_runs)
app.command()(runs.status)
app.command()(runs.cancel)
app.command()(runs.retry)
app.command()(logs.logs)
app.command()(logs.metrics)
app.command("why-slow")(why_slow.why_slow)
app.command()(clusters.script)
app.command()(clusters.cluster)
app.command("usage")(usage.usage_report)
app.add_typer(clusters.verl_app, name="verl")
app.add_typer(tokens.token_app, name="token")
app.add_typer(webhooks.webhook_app, name="webhook")
