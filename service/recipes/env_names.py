"""Which environment variable names a spec may set for its job (env vars and secrets alike),
and which values.

Names are matched whole; the loader's, the interpreter's, the shell's, Ray's own and the
service's (``RLRUN_*``: the grant and where to redeem it) variables are refused, so a spec cannot
change what code the job's processes load. A deployment may exempt names with
``RLRUN_ENV_ALLOW``; a request never can.

Values are literal: Ray expands ``$NAME`` and ``${NAME}`` in ``env_vars`` values from the
environment of the process that starts the job (``os.path.expandvars``), so a value holding
either would read another variable's value into the job; such values are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# What os.path.expandvars replaces: "$" then a word character or "{".
EXPANDABLE = re.compile(r"\$[A-Za-z0-9_{]")
DENIED_PREFIXES = (
    "LD_", "DYLD_", "PYTHON", "RAY_", "PERL5", "RUBY", "NODE_", "BASH_FUNC_", "RLRUN_",
)  # fmt: skip
DENIED_NAMES = frozenset(
    {"PATH", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PS4", "GCONV_PATH", "LOCPATH", "NLSPATH",
     "HOSTALIASES", "MALLOC_CONF", "LIBRARY_PATH", "HOME", "TMPDIR",
     "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "PIP_TRUSTED_HOST",
     "PIP_FIND_LINKS", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL"}
)  # fmt: skip


def refusal(name: str, allow: Iterable[str] = ()) -> str | None:
    """Why ``name`` may not be set by a spec, or None when it may."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return f"{name!r} is not an environment variable name"
    if name in allow:
        return None
    upper = name.upper()
    if upper in DENIED_NAMES or upper.startswith(DENIED_PREFIXES):
        return f"{name} may change what the job's processes load; it is not settable by a spec"
    return None


def value_refusal(value: object) -> str | None:
    """Why ``value`` may not be an env var's value for a job, or None when it may."""
    if isinstance(value, str) and EXPANDABLE.search(value):
        return "'$NAME' and '${NAME}' would be expanded by Ray from its environment: not allowed"
    return None
