"""The ``verl-fully-async`` recipe: preset + request -> overrides -> verl's config -> launch.

One straight pipeline (``build``): the overrides are parsed once (``overrides.parse_all``), then
guard -> compose -> check -> launch, each stage taking the previous one's output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from pydantic import ValidationError

from service.errors import InvalidSpec, dotted, field_error, invalid_from_pydantic
from service.metrics.keys import TRAINER_STEP_KEY
from service.recipes.base import Launch, LaunchContext, RunSpec
from service.recipes.verl import (
    command,
    dead_keys,
    guard,
    overrides,
    paths,
    preflight,
    read_keys,
    rules,
    shipped,
    stack,
    typed_keys,
    versions,
)
from service.recipes.verl.hydra_check import OverrideError, base_config, compose_typed
from service.recipes.verl.overrides import Loc, Override
from service.recipes.verl.preset import PRESETS, deep_merge
from service.recipes.verl.spec import VerlFullyAsyncSpec
from service.settings import Settings


class VerlFullyAsyncRecipe:
    """verl's fully async GRPO trainer, checked against verl's own Hydra config at submit time."""

    name: ClassVar[str] = "verl-fully-async"
    spec_model: ClassVar[type[RunSpec]] = VerlFullyAsyncSpec
    presets: ClassVar[tuple[str, ...]] = tuple(sorted(PRESETS))

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cache = Path(settings.verl_cache_dir)

    def resolve(self, spec: VerlFullyAsyncSpec) -> VerlFullyAsyncSpec:
        """The request on top of its preset: the spec the launch is built from."""
        if spec.preset is None:
            return spec
        if spec.preset not in PRESETS:
            msg = f"unknown preset {spec.preset!r}; known: {', '.join(sorted(PRESETS))}"
            raise InvalidSpec(msg, [field_error(["preset"], msg, "unknown_preset")])
        body = deep_merge(
            PRESETS[spec.preset](self.settings), spec.model_dump(mode="json", exclude_unset=True)
        )
        try:
            return VerlFullyAsyncSpec.model_validate(body)
        except ValidationError as exc:
            raise invalid_from_pydantic(exc) from exc

    @staticmethod
    def _verl(full: VerlFullyAsyncSpec) -> str:
        """The verl release the spec's nodes run: the one it names, else the service's."""
        return full.verl_version or versions.installed()

    def checkpoint_dir(self, run_id: str) -> str:
        return str(PurePosixPath(self.settings.verl_checkpoint_root) / run_id)

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        """The accept path, one stage after another, each on the one before's output: the
        overrides parsed once, guarded, composed into verl's config, checked, built."""
        assert isinstance(spec, VerlFullyAsyncSpec)
        return self.launch(self.check(self.compose(self.guard(self.resolve(spec), ctx))))

    def guard(self, full: VerlFullyAsyncSpec, ctx: LaunchContext) -> Guarded:
        """The spec's own overrides parsed (the only time), and what the service refuses."""
        own = overrides.parse_all(command.user_overrides(full))
        refused = [field_error(loc, why, "verl_rule") for loc, why in command.unread_fields(full)]
        refused += guard.check_overrides(own, self.settings.override_allow)
        refused += guard.check_runtime_env(
            full.runtime_env.env_vars,
            full.runtime_env.pip,
            command.service_env(full, ctx.stop_grace_s),
            self.settings.env_allow,
        )
        refused += stack.refusals(full, self._verl(full), self.settings.preflight_packages)
        if refused:
            raise InvalidSpec(f"{len(refused)} field(s) refused: {refused[0]['msg']}", refused)
        return Guarded(full, ctx, own)

    def compose(self, g: Guarded) -> Composed:
        """Every override verl is given (the spec's fields, then its own), and verl's config
        with them applied; Hydra's refusals under the field of each override."""
        full = g.spec
        try:
            fields = overrides.parse_all(
                command.field_overrides(full, self.checkpoint_dir(g.ctx.run_id))
            )
            items = shipped.rewrite([*fields, *g.overrides], full.files)
        except command.Unexpressible as exc:
            raise InvalidSpec(str(exc), [field_error(exc.loc, str(exc))]) from exc
        name = command.config_name(full)
        version, root = versions.root_for(full.verl_version, self._cache)
        shared, own = _per_run(items)
        ordered = shared + own
        try:
            cfg = compose_typed(name, shared, root, then=own)
        except OverrideError as exc:
            errors = [
                field_error(
                    ordered[i].loc if i >= 0 else ("overrides",),
                    (_untyped(name, ordered[i], root) if i >= 0 else None) or msg,
                    "verl_config",
                )
                for i, msg in exc.problems
            ]
            raise InvalidSpec(f"verl's config refuses: {errors[0]['msg']}", errors) from exc
        return Composed(g, items, name, version, root, cfg)

    def check(self, c: Composed) -> Checked:
        """The composed config against what verl reads and the rules it enforces at run time."""
        full, cfg = c.guarded.spec, c.cfg
        added = [
            (item, why)
            for item in c.overrides
            if (why := _untyped(c.config_name, item, c.root, added_only=True))
        ]
        unread = [
            (item, found)
            for item in c.overrides
            if item.parsed and item.op in ("+", "++") and not item.group
            if (found := read_keys.problem(c.config_name, item.parsed.key, c.root, self._cache))
        ]
        added += [(item, why) for item, (refused, why) in unread if refused]
        if added:
            errors = [field_error(item.loc, why, "verl_config") for item, why in added]
            raise InvalidSpec(f"verl's config refuses: {added[0][1]}", errors)
        where = rules.Locator(c.overrides, _spec_keys())
        errors, warnings = rules.check(cfg, full, where, self.settings.verl_loggers_configured)
        warnings += [f"{dotted(item.loc)}: {why}" for item, (refused, why) in unread if not refused]
        warnings += stack.warnings(full, c.version, self.settings.preflight_packages)
        warnings += dead_keys.warnings(c.overrides, full, c.version)
        target = _target_warning(full.stop_when.key if full.stop_when else None)
        warnings += [target] if target else []
        errors += [
            field_error(where(key), f"{key}: {path!r} {why}", "verl_rule")
            for key, path, why in preflight.unshipped(cfg, full.files)
        ]
        pins = paths.PathPins(self.settings.verl_checkpoint_root, self.settings.verl_data_roots)
        errors += paths.check_paths(
            cfg,
            self.checkpoint_dir(c.guarded.ctx.run_id),
            where,
            pins,
            lambda key: where.set_by(key) is not None,
        )
        if errors:
            raise InvalidSpec(
                f"{len(errors)} verl rule(s) broken, first: {errors[0]['field']}", errors
            )
        reads = paths.read_paths(
            cfg,
            self.checkpoint_dir(c.guarded.ctx.run_id),
            lambda key: where.set_by(key) is not None,
        )
        return Checked(c, warnings, reads)

    def launch(self, k: Checked) -> Launch:
        c = k.composed
        full, cfg, stop_grace_s = c.guarded.spec, c.cfg, c.guarded.ctx.stop_grace_s
        return Launch(
            argv=preflight.launcher_argv(
                preflight.plan(
                    cfg,
                    full.resources.accelerator,
                    self.settings,
                    c.version,
                    versions.requires(c.root),
                ),
                command.argv(full, c.overrides),
            ),
            runtime_env=command.with_env(
                command.runtime_env(full, stop_grace_s), command.samples_env(full, cfg)
            ),
            shape=command.shape(cfg, full.resources.accelerator, command.is_v1(full)),
            warnings=k.warnings,
            total_steps=command.planned_syncs(cfg, command.is_v1(full)),
            progress_key=TRAINER_STEP_KEY if command.is_v1(full) else None,
            samples_per_sync=command.samples_per_sync(cfg, command.is_v1(full)),
            files=dict(full.files),
            reads=k.reads,
            checkpoints=int(cfg.get("trainer", {}).get("save_freq", -1) or -1) > 0,
        )


@dataclass(frozen=True)
class Guarded:
    """The resolved spec and its own overrides, parsed and allowed."""

    spec: VerlFullyAsyncSpec
    ctx: LaunchContext
    overrides: list[Override]


@dataclass(frozen=True)
class Composed:
    """Every override verl is given, in order, and verl's config composed with them."""

    guarded: Guarded
    overrides: list[Override]
    config_name: str
    version: str
    root: Path | None
    cfg: dict[str, Any]


@dataclass(frozen=True)
class Checked:
    composed: Composed
    warnings: list[str]
    reads: list[str]  # the absolute paths and URIs the spec has the job read


RUN_DIR_LOC = ("trainer", "default_local_dir")
# The overrides that name the run's own directory (new with every run id), by where they come
# from: the checkpoint dir and the rollout samples' dir in it.
PER_RUN: dict[Loc, str] = {
    RUN_DIR_LOC: "trainer.default_local_dir",
    ("samples",): "trainer.rollout_data_dir",
}


def _per_run(items: list[Override]) -> tuple[list[Override], list[Override]]:
    """The overrides split into those a composition is kept by, and those naming the run's own
    directory (new with every run id), applied after it when no other override touches their
    keys: a spec checked again (a repeated dry run) is then not composed again."""
    own = [item for item in items if item.loc in PER_RUN]
    if not own or len({item.loc for item in own}) != len(own):
        return items, []
    for key in (PER_RUN[item.loc] for item in own):
        for item in items:
            if item in own:
                continue
            other = item.key
            if other is None:
                return items, []
            if other == key or key.startswith(other + ".") or other.startswith(key + "."):
                return items, []
    return [item for item in items if item not in own], own


def _untyped(
    config_name: str, item: Override, root: Path | None, added_only: bool = False
) -> str | None:
    """The refusal for an override whose key lands in a typed section of verl's config that
    lacks it (Hydra lets ``+key``/``++key`` add any key; verl's dataclasses do not)."""
    p = item.parsed
    if p is None or p.group or (added_only and p.kind not in ("+", "++")):
        return None
    return typed_keys.missing_field(base_config(config_name, root), p.key, root)


@functools.cache
def _spec_keys() -> dict[str, command.Loc]:
    return command.spec_keys()


# The families of keys verl's console logger prints (its trainer, rollouter, validation and
# timers; which keys within them depends on the config and the data sources).
LOGGED_FAMILIES = (
    "actor/",
    "critic/",
    "training/",
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "response_length/",
    "prompt_length/",
    "global_seqlen/",
    "fully_async/",
    "separate_async/",
    "rollout_corr/",
    "val-core/",
    "val-aux/",
)


def _target_warning(key: str | None) -> str | None:
    """A warning for a target on a key verl is not known to log: its keys depend on the
    config, so it is not refused, but a typo would leave the run to its end."""
    if key is None or key.startswith(LOGGED_FAMILIES):
        return None
    families = ", ".join(f"{f}..." for f in LOGGED_FAMILIES[:4])
    return (
        f"stop_when.key: verl is not known to log {key!r} (its keys are {families}, "
        "val-core/<data source>/...): the target is reached only if the run logs it"
    )
