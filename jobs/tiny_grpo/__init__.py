"""tiny-grpo: a small GRPO trainer on CPU in verl's fully async shape (a demo and test workload).

It is not a stand-in for verl: the "model" is a table of logits and the task is toy arithmetic.
It exists so the whole path (placement on virtual NPUs, async rollout and training, bounded
staleness, parameter syncs, verl-format console metrics) runs and can be tested without
accelerators. Run on a cluster with ``python3 -m jobs.tiny_grpo [options]``.
"""
