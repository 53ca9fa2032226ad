"""Secrets by reference: a spec names them, the service resolves their values at submit time
from its own store, and no answer, script or log line of the service carries a value.

The store is files ``<RLRUN_SECRETS_DIR>/<team>/<name>`` then ``<RLRUN_SECRETS_DIR>/<name>``,
then environment variables ``RLRUN_SECRET_<TEAM>__<NAME>`` then ``RLRUN_SECRET_<NAME>`` (upper
case, ``-`` and ``.`` as ``_``): a team's own secret first, then one the deployment shares.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MASK = "***"
# Names and values that look like credentials: masked in every answer.
SECRET_WORDS = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE|SIGNATURE", re.I)
SECRET_VALUE = re.compile(
    r"(sk|pk|rk|hf|ghp|gho|ghs|glpat|xox[abprs]|AKIA|ASIA)[-_]?[A-Za-z0-9_-]{12,}"
    r"|(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9+_=-]{32,}"
)


class SecretMissing(LookupError):
    """A named secret is not in the store (the message carries the name, never a value)."""


class SecretStore:
    def __init__(self, directory: str | None, environ: Mapping[str, str] | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self.environ = os.environ if environ is None else environ

    def _source(self, team: str, name: str) -> Path | str | None:
        """Where the secret is: its file, the name of its env var, or None."""
        if not SECRET_NAME.fullmatch(name):
            return None
        if self.directory is not None:
            for path in (self.directory / team / name, self.directory / name):
                if path.is_file():
                    return path
        upper = re.sub(r"[-.]", "_", name).upper()
        team_upper = re.sub(r"[-.]", "_", team).upper()
        for var in (f"RLRUN_SECRET_{team_upper}__{upper}", f"RLRUN_SECRET_{upper}"):
            if var in self.environ:
                return var
        return None

    def get(self, team: str, name: str) -> str | None:
        source = self._source(team, name)
        if isinstance(source, Path):
            return source.read_text().strip()
        return None if source is None else self.environ[source]

    def unknown(self, team: str, refs: Mapping[str, str]) -> list[str]:
        """The env vars of ``{env var: secret name}`` whose secret is not in the store (no value
        is read)."""
        return [var for var, name in refs.items() if self._source(team, name) is None]

    def resolve(self, team: str, refs: Mapping[str, str]) -> dict[str, str]:
        """Env var name -> value for each ``{env var: secret name}``; ``SecretMissing`` if any
        is not in the store."""
        out: dict[str, str] = {}
        for var, name in refs.items():
            value = self.get(team, name)
            if value is None:
                raise SecretMissing(f"secret {name!r} (for {var}) is not in the service's store")
            out[var] = value
        return out


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


def redact(text: str, values: list[str]) -> str:
    """``text`` with every secret value in ``values`` replaced by the mask."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= 4:
            text = text.replace(value, MASK)
    return text
