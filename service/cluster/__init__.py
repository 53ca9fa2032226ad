"""Ray as an executor: the one Jobs API client, and the local head for embedded mode."""
