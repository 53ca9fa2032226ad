"""Refuse a shape that can never run on this cluster, naming the spec fields and a shape that fits.

A group larger than every node (e.g. 16 NPUs on one node where nodes have 8) is the classic
case: the suggestion keeps the role's accelerators and splits them into more, smaller groups
(``n_nodes_train=2, n_gpus_training=8``), using the fields each ``Group`` says it came from.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace

from service.errors import InvalidSpec, field_error
from service.scheduling.inventory import Inventory
from service.scheduling.placement import Fitter, Pool, pack
from service.scheduling.shape import Group, ResourceShape


def on_empty_cluster(inventory: Inventory) -> Fitter:
    """Shapes packed onto the whole cluster with nothing running: one that fails here can never
    run. Admission, the dry-run plan and the refusal at the door all ask this."""
    return Fitter(Pool.of(inventory.totals()))


def never_fits(
    shape: ResourceShape, inventory: Inventory, team: str, quota: int | None
) -> InvalidSpec | None:
    """The 422 for a ``shape`` that can never be admitted here, or None when it can be."""
    acc = shape.accelerator
    if quota is not None and shape.accelerators > quota:
        msg = f"needs {shape.accelerators} {acc}s but team {team}'s quota is {quota}"
        return InvalidSpec(msg, [field_error(_loc(f, "team"), msg) for f in _size_fields(shape)])
    ever = on_empty_cluster(inventory)
    if not inventory.nodes or ever.fit(shape) is not None:
        return None
    totals = ever.pool
    node_acc, node_cpu = totals.largest(acc), totals.largest("CPU")
    errors = []
    for group in _distinct(shape.groups):
        if group.accelerators > node_acc or group.cpus > node_cpu:
            msg = (
                f"{group.role} needs {group.accelerators} {acc} and {group.cpus:g} CPUs on one "
                f"node; the largest node has {node_acc:g} {acc} and {node_cpu:g} CPUs"
            )
            errors.append(field_error(_loc(group.size_field, "resources"), msg))
    if not errors:
        msg = (
            f"needs {shape.accelerators} {acc} and {_cpus(shape):g} CPUs in all; the cluster has "
            f"{inventory.sum(acc):g} {acc} and {inventory.sum('CPU'):g} CPUs on "
            f"{len(inventory.nodes)} node(s)"
        )
        fields = list(dict.fromkeys(g.count_field or g.size_field for g in shape.groups))
        errors = [field_error(_loc(f, "resources"), msg) for f in fields or [None]]
    suggestion = suggest(shape, totals)
    detail = "this shape can never fit the cluster: " + errors[0]["msg"]
    if suggestion:
        hint = ", ".join(f"{k}={v}" for k, v in suggestion.items())
        detail += f"; try {hint}"
        for e in errors:
            e["msg"] += f"; try {hint}"
    exc = InvalidSpec(detail, errors)
    if suggestion:
        exc.extra["suggestion"] = suggestion
    return exc


def suggest(shape: ResourceShape, totals: Pool) -> dict[str, int]:
    """Spec field values that re-split each oversized role into groups the nodes can hold."""
    acc = shape.accelerator
    node_acc = int(totals.largest(acc))
    roles: dict[str, list[Group]] = defaultdict(list)
    for g in shape.groups:
        roles[g.role].append(g)
    groups: list[Group] = []
    values: dict[str, int] = {}
    for role_groups in roles.values():
        first = role_groups[0]
        uniform = all(g == first for g in role_groups)
        if first.accelerators <= node_acc or not uniform or not first.size_field:
            groups.extend(role_groups)
            continue
        total = first.accelerators * len(role_groups)
        size = next((d for d in range(node_acc, 0, -1) if total % d == 0), 0)
        if not size or (total // size != len(role_groups) and not first.count_field):
            return {}
        cpus = first.cpus * size / first.accelerators
        groups.extend([replace(first, accelerators=size, cpus=cpus)] * (total // size))
        if first.count_field:
            values[first.count_field] = total // size
        values[first.size_field] = size
    if not values or pack(replace(shape, groups=tuple(groups)), totals) is None:
        return {}
    return values


def _distinct(groups: tuple[Group, ...]) -> list[Group]:
    return list(dict.fromkeys(groups))


def _size_fields(shape: ResourceShape) -> list[str | None]:
    return list(dict.fromkeys(g.size_field for g in shape.groups)) or [None]


def _cpus(shape: ResourceShape) -> float:
    return sum(g.cpus for g in shape.groups) + shape.driver_cpus


def _loc(dotted: str | None, fallback: str) -> list[str | int]:
    """``"groups[0].accelerators"`` -> ``["groups", 0, "accelerators"]``."""
    parts = re.findall(r"[^.\[\]]+", dotted or fallback)
    return [int(p) if p.isdigit() else p for p in parts]
