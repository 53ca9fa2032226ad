"""The options the commands share: the service's URL, the token, the output's form, following."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from service.client import DEFAULT_URL, TOKEN_ENV, URL_ENV


class Output(StrEnum):
    table = "table"
    json = "json"


ServerOpt = Annotated[
    str | None,
    typer.Option("--server", envvar=URL_ENV, help=f"Service URL [default: {DEFAULT_URL}]"),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar=TOKEN_ENV, help="Bearer token", show_default=False),
]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Follow until the run ends")]
