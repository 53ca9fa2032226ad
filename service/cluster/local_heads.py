"""The embedded Ray heads of the clusters declared ``local``: each prepared to run as a user of
its own (``embedded_trust``), then all started at once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from service.cluster import embedded_trust, job_user
from service.cluster import spec as cluster_spec
from service.cluster.embedded_trust import StartRefused
from service.cluster.job_user import JobUserError
from service.cluster.local_ray import LocalRayCluster, PortInUse
from service.recipes.tiny_grpo import default_checkpoint_root
from service.settings import Settings

log = logging.getLogger(__name__)


async def start_local_heads(
    settings: Settings, specs: list[cluster_spec.ClusterSpec]
) -> dict[str, LocalRayCluster]:
    """Start the embedded Ray head of each cluster declared ``local``, at once; none is left
    running if one fails to start."""
    if not any(spec.local is not None for spec in specs):
        return {}
    # Made for the jobs' user if missing; one that exists keeps its owner and mode.
    checkpoints = [
        Path(settings.tiny_grpo_checkpoint_root or default_checkpoint_root(settings.instance_name)),
        Path(settings.verl_checkpoint_root),
    ]
    made: set[Path] = set()
    # Each embedded cluster of a clusters file runs as a user of its own: none reads another's.
    trust = {}
    try:
        for spec in specs:
            if spec.local is not None:
                trust[spec.name] = await asyncio.to_thread(
                    embedded_trust.prepare,
                    settings,
                    checkpoints,
                    spec.local.user if settings.clusters_file else settings.local_job_user,
                    job_user.default_name(
                        settings.instance_name,
                        spec.name if settings.clusters_file else None,
                    ),
                    made,
                )
    except (StartRefused, JobUserError) as exc:
        log.error("cannot start the local Ray cluster: %s", exc)
        raise
    heads = {
        spec.name: LocalRayCluster(
            spec.local.npus,
            cpus_per_node=spec.local.cpus_per_node,
            # The one embedded head of RLRUN_RAY_ADDRESS=local keeps its settings' dir.
            base_dir=settings.local_ray_dir if not settings.clusters_file else None,
            port=spec.local.port,
            dashboard_port=spec.local.dashboard_port,
            state_dir=settings.local_ray_state_path,
            user=trust[spec.name].user,
            python=trust[spec.name].python,
        )
        for spec in specs
        if spec.local is not None
    }
    for name, head in heads.items():
        log.info("starting a local Ray head %r with NPUs per node %s", name, head.npus_per_node)
    results = await asyncio.gather(
        *(asyncio.to_thread(h.start) for h in heads.values()), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(asyncio.to_thread(h.cleanup) for h in heads.values()))
        if isinstance(failed[0], PortInUse):
            log.error("cannot start the local Ray cluster: %s", failed[0])
        raise failed[0]
    return heads
