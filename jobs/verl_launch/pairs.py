"""Stack pairs known to break, and the pairings verl and vLLM-Ascend test: data, one row each.

A row names the versions that meet (every one must match), the accelerators it applies to, what
users see, the versions that work and where that is written. The service checks a spec against
it at submit (the target image's pins, ``TESTED``, with the spec's ``verl_version``); the
launcher checks every node's installed packages (package metadata, nothing imported) before
verl starts. A combination that matches no broken row but is not a tested pairing is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# CANN is no Python package: its version is read from the toolkit's files (``cann_version``)
# and given here under this name.
CANN = "cann"


@dataclass(frozen=True)
class Pair:
    name: str
    accelerators: tuple[str, ...]  # the spec's resources.accelerator values it applies to
    when: Mapping[str, str]  # distribution -> specifier; the row matches when all of them do
    symptom: str
    works: str
    source: str

    def matches(self, versions: Mapping[str, str]) -> bool:
        for dist, spec in self.when.items():
            have = versions.get(dist)
            if have is None or not _contains(spec, have):
                return False
        return True

    def says(self) -> str:
        return f"{self.symptom}; works: {self.works} ({self.source})"


def _contains(spec: str, have: str) -> bool:
    try:
        # A local label (torch 2.10.0+cpu) is the same release as its public version.
        return SpecifierSet(spec).contains(Version(have.split("+", 1)[0]), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


BROKEN: tuple[Pair, ...] = (
    Pair(
        name="verl 0.9.0 HCCL weight sync",
        accelerators=("npu",),
        when={"verl": "==0.9.0"},
        symptom="verl 0.9.0's HCCL checkpoint engine fails the weight update between separate "
        "trainer and rollout groups with an HCCL error, so a fully async run on NPU stops at "
        "its first sync",
        works="verl>=0.9.1",
        source="verl #7416; fixed by #7487 on release/v0.9.0 after the v0.9.0 tag, "
        "verl/checkpoint_engine/hccl_checkpoint_engine.py",
    ),
    Pair(
        name="verl 0.9 x vLLM 0.32 pause_generation",
        accelerators=("npu", "gpu"),
        when={"verl": ">=0.9.0,<0.9.2", "vllm": ">=0.32"},
        symptom="verl 0.9's vLLM server calls AsyncLLM.pause_generation("
        "wait_for_inflight_requests=False), a keyword vLLM 0.32 no longer takes (mode= instead): "
        "the first weight sync fails with a TypeError",
        works="vllm 0.24.0 on GPU (the verl[vllm] extra), vllm 0.23.0 with vllm-ascend 0.23.0 "
        "on NPU",
        source="verl 0.9.1 verl/workers/rollout/vllm_rollout/vllm_async_server.py:993; "
        "vLLM 0.32.0 vllm/v1/engine/async_llm.py:952",
    ),
    Pair(
        name="vLLM-Ascend 0.23 x another vLLM",
        accelerators=("npu",),
        when={"vllm-ascend": "==0.23.*", "vllm": "!=0.23.*"},
        symptom="vLLM-Ascend is built against one vLLM release; beside another one its "
        "platform plugin does not match vLLM's internals",
        works="vllm==0.23.0 with vllm-ascend==0.23.0",
        source="vLLM-Ascend v0.23.0 docs/source/community/versioning_policy.md:26",
    ),
    Pair(
        name="torch_npu 2.10 x another torch",
        accelerators=("npu",),
        when={"torch-npu": "==2.10.*", "torch": "!=2.10.*"},
        symptom="torch_npu is built for one torch release; the verl[vllm] extra pulls torch "
        "2.11 (and vllm 0.24) under it, which the NPU stack does not run on",
        works="torch==2.10.0 with torch-npu==2.10.0.post4 (or .post2)",
        source="vLLM-Ascend v0.23.0 docs/source/community/versioning_policy.md:26; the verl "
        "0.9.1 wheel's vllm extra (Requires-Dist torch==2.11.0, vllm==0.24.0)",
    ),
    Pair(
        name="vLLM-Ascend 0.23 x CANN before 9.0.1",
        accelerators=("npu",),
        when={"vllm-ascend": "==0.23.*", CANN: "<9.0.1"},
        symptom="vLLM-Ascend 0.23's kernels are built for CANN 9.0.1 or later",
        works="CANN 9.1.0 (verl's Ascend images) or 9.0.1 (vLLM-Ascend's stable CANN)",
        source="vLLM-Ascend v0.23.0 docs/source/community/versioning_policy.md:26",
    ),
)

# The pairings each accelerator's worker image carries (docker/<accelerator>-worker.constraints
# .txt, a test keeps them equal): what a spec is checked against at submit.
TESTED: Mapping[str, Mapping[str, str]] = {
    # verl's Ascend images for its 0.9 line (docs/ascend_tutorial/get_start/
    # dockerfile_build_guidance.rst, release/v0.9.0); CANN from the base image's tag.
    "npu": {
        CANN: "9.1.0",
        "torch": "2.10.0",
        "torch-npu": "2.10.0.post4",
        "vllm": "0.23.0",
        "vllm-ascend": "0.23.0",
        "triton-ascend": "3.2.2",
        "transformers": "5.5.4",
        "verl": "0.9.1",
    },
    # The verl 0.9.1 wheel's vllm extra.
    "gpu": {
        "torch": "2.11.0",
        "vllm": "0.24.0",
        "transformers": "5.9.0",
        "verl": "0.9.1",
    },
}

# Where a node's CANN toolkit says its version: the toolkit's install info, the file
# vLLM-Ascend's collect_env.py reads (its ``version=`` line).
CANN_INFO = "/usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info"


def cann_version(path: str) -> str | None:
    """The ``version=`` of a CANN install info file; None if there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition("=")
                if key.strip() == "version" and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def broken(accelerator: str, versions: Mapping[str, str]) -> list[Pair]:
    """The rows ``versions`` (distribution -> version) meet on ``accelerator``."""
    return [p for p in BROKEN if accelerator in p.accelerators and p.matches(versions)]


def untested(accelerator: str, versions: Mapping[str, str]) -> list[str]:
    """``name version`` for each known version that is not the tested pairing's."""
    tested = TESTED.get(accelerator, {})
    return [
        f"{dist} {versions[dist]} (tested: {want})"
        for dist, want in tested.items()
        if dist in versions and versions[dist].split("+", 1)[0] != want
    ]


def dists(accelerator: str) -> list[str]:
    """The distributions whose versions the rows of ``accelerator`` read (CANN aside)."""
    names = {d for p in BROKEN if accelerator in p.accelerators for d in p.when}
    names |= set(TESTED.get(accelerator, {}))
    return sorted(names - {CANN})
