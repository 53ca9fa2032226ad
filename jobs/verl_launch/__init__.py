"""The verl launcher: a preflight on every node of the cluster, then verl with the exact argv.

Its command line is ``python3 -m jobs.verl_launch --plan <json> -- <verl argv>``. The plan
(``Plan``) names the paths the run needs, the packages the nodes must carry and whether Ray's
accelerators must be real devices. The launcher prints one line ``PREFIX + json`` with every
node's checks (the service stores it on the run), and on any failure exits ``EXIT_FAILED``
before verl starts, its last line naming the node and the path or package.
"""

from __future__ import annotations

from typing import Any, TypedDict

PREFIX = "rlrun-preflight: "
HANDOVER = "rlrun-launch: exec "
EXIT_FAILED = 3


class PathCheck(TypedDict):
    key: str  # the verl config key that names the path
    path: str


class Plan(TypedDict, total=False):
    accelerator: str  # the Ray resource, "NPU" or "GPU"
    check_devices: bool  # Ray's count must match the node's device files
    files: list[PathCheck]  # readable files (or directories of files, e.g. parquet dirs)
    dirs: list[PathCheck]  # readable directories (the model)
    writable: list[PathCheck]  # directories the run creates (nearest existing parent writable)
    packages: dict[str, str]  # distribution name -> version specifier ("" = installed)
    timeout_s: float
    stack: str  # the spec's accelerator ("npu", "gpu"): its known broken pairs are checked


Report = dict[str, Any]
