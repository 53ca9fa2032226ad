"""Which queued run goes to Ray, when, and where.

- ``inventory``: the cluster's nodes and free resources, read from Ray and cached briefly.
- ``placement``: packing a run's groups onto nodes.
- ``fit``: refusing at the door a shape that can never fit, with a suggestion that does.
- ``admission``: the pure decision (``decide``): order, quotas, gang admission, backfill.
- ``node_groups``: nodes per team on one cluster, each group decided on its own.
- ``across``: one queue over several clusters, each run placed where it starts soonest.
- ``backlog``: the queue as stored, read from the database for ``decide``.
"""
