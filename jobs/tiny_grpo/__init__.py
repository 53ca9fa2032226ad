"""tiny-grpo: a small GRPO trainer on CPU in verl's fully async shape (a demo and test workload).

It is not a stand-in for verl: the "model" is a table of logits and the task is toy arithmetic.
It exists so the whole path (placement on virtual NPUs, async rollout and training, bounded
staleness, parameter syncs, verl-format console metrics) runs and can be tested without
accelerators. Run on a cluster with ``python3 -m jobs.tiny_grpo [options]``.
"""

# Every metric key a tiny-grpo run logs (its rollouter's, trainer's and validation lines): a
# target (``stop_when``) on any other key would never be reached.
LOGGED_KEYS = frozenset(
    {
        "fully_async/rollouter/active_time",
        "fully_async/rollouter/version_time",
        "fully_async/rollouter/idle_ratio",
        "fully_async/rollouter/step_generated_samples",
        "training/global_step",
        "training/epoch",
        "critic/score/mean",
        "critic/score/max",
        "critic/score/min",
        "critic/rewards/mean",
        "critic/rewards/max",
        "critic/rewards/min",
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/rollout_corr/rollout_is_mean",
        "actor/rollout_corr/rollout_rs_masked_fraction",
        "critic/advantages/mean",
        "critic/advantages/max",
        "critic/advantages/min",
        "timing_s/step",
        "response_length/mean",
        "actor/lr",
        "timing_s/param_sync",
        "fully_async/count/stale_trajectory_processed",
        "fully_async/count/current_param_version",
        "fully_async/count/mean_staleness",
        "fully_async/partial/partial_ratio",
        "fully_async/trainer/idle_ratio",
        "val-core/tiny/arith/acc/mean@1",
        "val-aux/tiny/arith/reward/mean@1",
        "val-aux/num_turns/mean",
    }
)
