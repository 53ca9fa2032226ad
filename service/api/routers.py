"""The API's routers, in the order their routes are matched."""

from __future__ import annotations

from service.api import (
    admin,
    grants,
    probes,
    prometheus,
    recipes,
    run_metrics,
    runs,
    script,
    usage,
    verl,
    webhooks,
    whoami,
)
from service.api import cluster as cluster_api

ROUTERS = (
    probes,
    webhooks,
    usage,
    runs,
    script,
    recipes,
    cluster_api,
    run_metrics,
    prometheus,
    verl,
    admin,
    whoami,
    grants,
)
