"""The API's answers: the response models (what the OpenAPI document shows and
``service.client`` reads answers into), the builders of the documents that need no domain
module (a run's, which does, is built in ``operations/run_docs.py``), and the one JSON encoding
of every answer and streamed event.

Routes send the documents as they are (``service.api.json_answer``), without validating them
again; a document is built from a ``Run`` or from a row with the same columns. No database or
server imports, so the client stays light; no domain module, so every floor may answer.

A module a theme, each the one home of its names (import them from it; this package names
none): ``documents`` (a row's attributes as a document, ``encode``), ``runs``, ``metrics`` (a
run's series, step time and rollout samples), ``cluster`` (the recipes and the clusters),
``admin`` (tokens, the audit trail, the caller, usage) and ``webhooks``.
"""
