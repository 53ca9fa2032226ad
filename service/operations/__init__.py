"""What the API does, without HTTP: accepting a run (and its dry-run plan), cancelling it, the
cluster view. Routes (``service.api``) parse, authorise, call one of these and answer; these take
plain inputs (a ``Principal``, a spec body, the replica's ``Parts``), return documents or raise
``service.errors``, and keep the house's transaction rules (short ones, none across a Ray call).
"""
