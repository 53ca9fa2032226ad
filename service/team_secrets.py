"""Secrets by reference: a spec names them, the service resolves their values from its own store
when the job redeems its grant, and no answer, script or log line of the service carries a value.

A team's secret resolves from that team's own namespace, then from the namespace the operator
shares with every team; never from another's:

- files ``<RLRUN_SECRETS_DIR>/teams/<team>/<name>``, then ``<RLRUN_SECRETS_DIR>/shared/<name>``;
- env vars ``RLRUN_SECRET_<NS>__<NAME>``, then ``RLRUN_SHARED_SECRET_<NAME>``.

``<NAME>`` is the name upper case with ``-`` and ``.`` as ``_``. ``<NS>`` encodes the team one to
one: letters and digits upper case, ``-`` as ``_H`` and ``_`` as ``_U`` (``ml-ops`` is
``ML_HOPS``, ``ml_ops`` is ``ML_UOPS``), so a namespace never holds ``__``, the separator. A name
that would hold it (``nlp__db_password``), or any character outside ``[A-Za-z0-9_.-]``, is not a
name a secret can have: it resolves nothing, exactly like a missing one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobs.samples import MASK as MASK
from jobs.samples import redact as redact

# What a spec may write as a secret's name (its form only; whether it can exist is ``valid``).
SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SEPARATOR = "__"
TEAM_PREFIX = "RLRUN_SECRET_"
SHARED_PREFIX = "RLRUN_SHARED_SECRET_"
# The service's own secrets (a Ray cluster's token): no spec can name them, unlike shared ones.
SERVICE_PREFIX = "RLRUN_SERVICE_SECRET_"
# Names and values that look like credentials: masked in every answer.
SECRET_WORDS = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE|SIGNATURE", re.I)
SECRET_VALUE = re.compile(
    r"(sk|pk|rk|hf|ghp|gho|ghs|glpat|xox[abprs]|AKIA|ASIA)[-_]?[A-Za-z0-9_-]{12,}"
    r"|(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9+_=-]{32,}"
)
_TEAM_ESCAPES = {"-": "_H", "_": "_U"}


class SecretMissing(LookupError):
    """A named secret is not in the store (the message carries the name, never a value)."""


def env_key(name: str) -> str:
    """A secret's name as it appears in an env var."""
    return re.sub(r"[-.]", "_", name).upper()


def valid(name: str) -> bool:
    """Whether a secret can have this name: its form, and no separator in its env spelling."""
    return bool(SECRET_NAME.fullmatch(name)) and SEPARATOR not in env_key(name)


def namespace(team: str) -> str:
    """The team's env namespace: one to one, and never holding the separator."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", team):
        raise ValueError(f"{team!r} is not a team name")
    return "".join(_TEAM_ESCAPES.get(c, c.upper()) for c in team)


def team_var(team: str, name: str) -> str:
    return f"{TEAM_PREFIX}{namespace(team)}{SEPARATOR}{env_key(name)}"


def shared_var(name: str) -> str:
    return SHARED_PREFIX + env_key(name)


class SecretStore:
    def __init__(self, directory: str | None, environ: Mapping[str, str] | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self.environ = os.environ if environ is None else environ

    def _source(self, team: str, name: str) -> Path | str | None:
        """Where the team's secret is: its file, the name of its env var, or None."""
        if not valid(name):
            return None
        if self.directory is not None:
            for path in (self.directory / "teams" / team / name, self.directory / "shared" / name):
                if path.is_file():
                    return path
        for var in (team_var(team, name), shared_var(name)):
            if var in self.environ:
                return var
        return None

    def get(self, team: str, name: str) -> str | None:
        source = self._source(team, name)
        if isinstance(source, Path):
            return source.read_text().strip()
        return None if source is None else self.environ[source]

    def service_secret(self, name: str) -> str | None:
        """A secret of the service's own namespace (a Ray cluster's token): the file
        ``<dir>/service/<name>`` or the env var ``RLRUN_SERVICE_SECRET_<NAME>``. No run can
        name one: a spec's secrets resolve in its team's namespace and the shared one only."""
        if not valid(name):
            return None
        if self.directory is not None and (self.directory / "service" / name).is_file():
            return (self.directory / "service" / name).read_text().strip()
        return self.environ.get(SERVICE_PREFIX + env_key(name))

    def unknown(self, team: str, refs: Mapping[str, str]) -> list[str]:
        """The env vars of ``{env var: secret name}`` whose secret is not the team's to have
        (missing, or a name no secret can have); no value is read."""
        return [var for var, name in refs.items() if self._source(team, name) is None]

    def resolve(self, team: str, refs: Mapping[str, str]) -> dict[str, str]:
        """Env var name -> value for each ``{env var: secret name}``; ``SecretMissing`` if any
        is not in the store."""
        out: dict[str, str] = {}
        for var, name in refs.items():
            value = self.get(team, name)
            if value is None:
                raise SecretMissing(missing_message(name))
            out[var] = value
        return out


def missing_message(name: str) -> str:
    """The one answer for a secret a team does not have, whatever the reason."""
    return f"secret {name!r} is not in the service's store"


def looks_secret(name: str, value: Any) -> bool:
    return bool(SECRET_WORDS.search(name)) or (
        isinstance(value, str) and SECRET_VALUE.fullmatch(value) is not None
    )


def masked_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: MASK if looks_secret(k, v) else v for k, v in env.items()}


def masked_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """A runtime env as an answer may show it: env values that look like keys masked."""
    out = dict(runtime_env)
    if isinstance(out.get("env_vars"), dict):
        out["env_vars"] = masked_env(out["env_vars"])
    return out


def masked_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    if isinstance(out.get("runtime_env"), dict):
        out["runtime_env"] = masked_runtime_env(out["runtime_env"])
    return out
