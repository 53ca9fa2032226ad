"""rlrun: a service that runs verl fully async GRPO training on a shared Ray cluster."""
