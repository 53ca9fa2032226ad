"""The env names a spec may not set: where code, models and data come from (indexes, proxies,
TLS trust), code the device and inference stacks load, device visibility, and the collective
libraries' variables past their tuning names. A 422 naming the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.recipes.env_names import COLLECTIVE_TUNING, refusal
from tests.test_verl_recipe import PRESET, build

DENIED = [
    "HF_ENDPOINT", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
    "all_proxy", "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "CURL_CA_BUNDLE", "OPENSSL_CONF", "VLLM_PLUGINS", "ASCEND_CUSTOM_OPP_PATH",
    "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "cuda_visible_devices",
    "UV_INDEX", "UV_INDEX_URL", "UV_INDEX_STRATEGY", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX",
    "PIP_INDEX_URL", "PIP_NO_INDEX", "PIP_REQUIRE_VIRTUALENV", "pip_index_url",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_DEBUG_FILE", "NCCL_TOPO_FILE",
    "NCCL_CONF_FILE", "HCCL_WHITELIST_FILE", "HCCL_RANK_TABLE_FILE", "nccl_debug",
]  # fmt: skip
# What verl's NPU and GPU launch scripts and docs set, and plain job variables.
ALLOWED = [
    "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_SOCKET_IFNAME",
    "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE", "NCCL_DEBUG",
    "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_IB_DISABLE", "GLOO_SOCKET_IFNAME",
    "TASK_QUEUE_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "WANDB_PROJECT", "HF_HUB_OFFLINE",
]  # fmt: skip


@pytest.mark.parametrize("name", DENIED)
def test_names_that_redirect_or_widen_the_job_are_refused(name: str) -> None:
    assert refusal(name) is not None


@pytest.mark.parametrize("name", ALLOWED)
def test_tuning_and_plain_names_pass(name: str) -> None:
    assert refusal(name) is None
    launch = build(PRESET | {"runtime_env": {"env_vars": {name: "1"}}})
    assert launch.runtime_env["env_vars"][name] == "1"


def test_every_allowed_collective_name_is_a_tuning_name() -> None:
    assert all(refusal(name) is None for name in COLLECTIVE_TUNING)
    assert all(name.startswith(("HCCL_", "NCCL_")) for name in COLLECTIVE_TUNING)


def test_an_operator_may_allow_a_denied_name() -> None:
    assert refusal("NCCL_TOPO_FILE", ["NCCL_TOPO_FILE"]) is None
    assert refusal("HTTPS_PROXY", ["HTTPS_PROXY"]) is None


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "ASCEND_RT_VISIBLE_DEVICES", "NCCL_NET_PLUGIN"])
def test_a_denied_name_is_a_422_at_its_field(api: TestClient, name: str) -> None:
    for dry in (True, False):
        body = PRESET | {"runtime_env": {"env_vars": {"WANDB_PROJECT": "p", name: "x"}}}
        resp = api.post("/runs", params={"dry_run": dry}, json=body)
        assert resp.status_code == 422, resp.text
        assert [e["field"] for e in resp.json()["errors"]] == [f"runtime_env.env_vars.{name}"]
        secret = api.post(
            "/runs", params={"dry_run": dry}, json=PRESET | {"secrets": {name: "some-secret"}}
        )
        assert secret.status_code == 422, secret.text
        [error] = secret.json()["errors"]
        assert error["field"] == f"secrets.{name}" and "store" not in error["msg"]
    assert api.get("/runs").json()["items"] == []
