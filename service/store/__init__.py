"""The system of record: engine and transaction boundary, models, the lifecycle's one writer."""
