"""Which environment variable names a spec may set for its job (env vars and secrets alike),
and which values.

Names are matched whole; the loader's, the interpreter's, the shell's, Ray's own and the
service's (``RLRUN_*``: the grant and where to redeem it) variables are refused, so a spec cannot
change what code the job's processes load; so are package indexes, proxies and TLS trust (where
code, models and data come from), device visibility (which accelerators a job sees), and the
collective libraries' variables other than their tuning names. A deployment may exempt names
with ``RLRUN_ENV_ALLOW``; a request never can.

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
# Compared in upper case: ``http_proxy`` is read as well as ``HTTP_PROXY``.
DENIED_PREFIXES = (
    "LD_",
    "DYLD_",
    "PYTHON",
    "RAY_",
    "PERL5",
    "RUBY",
    "NODE_",
    "BASH_FUNC_",
    # The service's own: the grant and where to redeem it.
    "RLRUN_",
    # Package indexes: where pip and uv fetch code from.
    "PIP_",
    "UV_INDEX",
)
DENIED_SUFFIXES = (
    # Device visibility (CUDA_, ASCEND_RT_, HIP_, ROCR_...): a job would take accelerators it
    # was not given.
    "_VISIBLE_DEVICES",
)
DENIED_NAMES = frozenset(
    {"PATH", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PS4", "GCONV_PATH", "LOCPATH", "NLSPATH",
     "HOSTALIASES", "MALLOC_CONF", "LIBRARY_PATH", "HOME", "TMPDIR",
     "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_FIND_LINKS", "UV_INSECURE_HOST",
     # Where downloads come from and whom TLS trusts: models, packages and loggers' traffic.
     "HF_ENDPOINT", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
     "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "OPENSSL_CONF",
     # Code loaded by the inference and device stacks.
     "VLLM_PLUGINS", "ASCEND_CUSTOM_OPP_PATH"}
)  # fmt: skip
# The collective libraries read many variables, some of which load plugins or read and write
# files (NCCL_NET_PLUGIN, NCCL_DEBUG_FILE, NCCL_TOPO_FILE...): only these tuning names pass
# (those verl's NPU and GPU launch scripts set, and the usual timeouts, interfaces and
# transport switches).
COLLECTIVE_PREFIXES = ("HCCL_", "NCCL_")
COLLECTIVE_TUNING = frozenset(
    {"HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_SOCKET_IFNAME", "HCCL_SOCKET_FAMILY",
     "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_DETERMINISTIC",
     "HCCL_BUFFSIZE", "HCCL_INTRA_ROCE_ENABLE", "HCCL_INTRA_PCIE_ENABLE",
     "HCCL_OP_EXPANSION_MODE", "HCCL_RDMA_TC", "HCCL_RDMA_SL", "HCCL_RDMA_TIMEOUT",
     "HCCL_RDMA_RETRY_CNT", "HCCL_IF_BASE_PORT",
     "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE",
     "NCCL_MNNVL_ENABLE", "NCCL_DETERMINISTIC", "NCCL_ALGO", "NCCL_PROTO",
     "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE",
     "NCCL_IB_HCA", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX",
     "NCCL_NET_GDR_LEVEL", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
     "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
     "NCCL_CROSS_NIC", "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT"}
)  # fmt: skip


def refusal(name: str, allow: Iterable[str] = ()) -> str | None:
    """Why ``name`` may not be set by a spec, or None when it may."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return f"{name!r} is not an environment variable name"
    if name in allow:
        return None
    upper = name.upper()
    if upper.endswith(DENIED_SUFFIXES):
        return f"{name} sets which devices the job's processes see; the service decides that"
    if upper.startswith(COLLECTIVE_PREFIXES) and name not in COLLECTIVE_TUNING:
        return (
            f"{name} is not one of the collective library's tuning variables a spec may set "
            "(an operator may allow it with RLRUN_ENV_ALLOW)"
        )
    if upper in DENIED_NAMES or upper.startswith(DENIED_PREFIXES):
        return f"{name} may change what the job's processes load; it is not settable by a spec"
    return None


def value_refusal(value: object) -> str | None:
    """Why ``value`` may not be an env var's value for a job, or None when it may."""
    if isinstance(value, str) and EXPANDABLE.search(value):
        return "'$NAME' and '${NAME}' would be expanded by Ray from its environment: not allowed"
    return None
