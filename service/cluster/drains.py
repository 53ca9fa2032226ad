"""The nodes Ray is draining, read from the cluster's GCS: Ray's dashboard does not show a
drain (its REST state API lists a draining node as ALIVE), while the GCS answers
``GetDrainingNodes`` (each node with its deadline) and ``GetAllNodeInfo`` (a node's
``state_snapshot`` DRAINING; the drain's reason only in its ``death_info``, once it is gone).
A drain comes from the autoscaler (idle or preemption) or from ``ray drain-node``; Ray stops
scheduling on the node, and whoever drained it kills it at the deadline.

Plain gRPC with Ray's generated stubs and the cluster's token as a bearer (no Ray core in the
service's process, one token per cluster); every call is bounded by a timeout."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

from service.cluster.ray_jobs import RayRejected, RayUnavailable

# Ray's generated modules are untyped.
_pb: Any = gcs_service_pb2
_grpc: Any = gcs_service_pb2_grpc


@dataclass(frozen=True)
class Drain:
    """A node being drained: its Ray id (hex) and its deadline (None: Ray was given none)."""

    node_id: str
    deadline: datetime | None

    def said(self, now: datetime) -> str:
        if self.deadline is None:
            return f"node {self.node_id} is draining (no deadline given)"
        left = (self.deadline - now).total_seconds()
        at = self.deadline.strftime("%H:%M:%S UTC")
        return f"node {self.node_id} is draining (deadline {at}, in {left:.0f} s)"


class DrainReader:
    """The draining nodes of one cluster, at its GCS (``host:port``)."""

    def __init__(self, gcs_address: str, token: str | None, timeout_s: float = 5.0) -> None:
        self.address = gcs_address
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(gcs_address)
        self._nodes = _grpc.NodeResourceInfoGcsServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def draining(self) -> list[Drain]:
        """Every node Ray is draining now."""
        try:
            reply = self._nodes.GetDrainingNodes(
                _pb.GetDrainingNodesRequest(),
                metadata=self._metadata,
                timeout=self._timeout_s,
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise RayRejected(f"Ray's GCS at {self.address} refused: {code}") from exc
            raise RayUnavailable(f"Ray's GCS at {self.address} did not answer: {code}") from exc
        return [
            Drain(n.node_id.hex(), _at(n.draining_deadline_timestamp_ms))
            for n in reply.draining_nodes
        ]


def _at(ms: int) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms > 0 else None
