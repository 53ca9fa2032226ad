"""``python -m service.cli``: the ``rlrun`` command."""

from service.cli import app

app()
