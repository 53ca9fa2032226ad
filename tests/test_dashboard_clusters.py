"""The dashboard's cluster view in a real browser with two declared clusters: each listed with
its health (one down), capacity (one read, one that cannot be read), labels and teams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.cluster.inventory_cache import InventoryCache
from service.cluster.registry import Health
from tests.browser import needs_chromium, until
from tests.conftest import make_settings
from tests.fake_ray import FakeRay
from tests.live import ServerThread
from tests.test_clusters import CLUSTERS_YAML, TWO_NODES

pytestmark = [
    needs_chromium,
    pytest.mark.slow,
]


def test_the_cluster_view_lists_every_cluster_with_its_health_and_capacity(
    tmp_path: Path,
    page: Any,
) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS_YAML)
    settings = make_settings(
        f"sqlite:///{tmp_path}/ui.db",
        "http://127.0.0.1:9",
        run_loops=False,
        clusters_file=str(path),
    )
    app = create_app(settings)
    with ServerThread(app) as url:
        clusters = app.state.services.clusters
        clusters.of("small").health = Health(up=False)
        clusters.of("big").inventory = InventoryCache(FakeRay(TWO_NODES), 0.0)
        page.goto(f"{url}/ui/#/cluster")
        until(page, "document.querySelectorAll('#clusters tr[data-cluster]').length === 2")
        small = page.locator("#clusters tr[data-cluster='small']").inner_text()
        big = page.locator("#clusters tr[data-cluster='big']").inner_text()
        assert "down since" in small and "site=hz" in small and "every team" in small
        assert "0.9.1" in small
        assert "up since" in big and "16 NPU (16 free)" in big and "vision" in big
        # The nodes below are the primary's, the first declared.
        assert page.locator("#primary-cluster").inner_text() == "Cluster small (the primary)"
        # A cluster that comes back shows so at the next refresh, without a reload.
        clusters.of("small").health = Health()
        until(
            page,
            "document.querySelector(\"#clusters tr[data-cluster='small']\").dataset.up === 'true'",
        )
        assert "cannot be read" in page.locator("#clusters tr[data-cluster='small']").inner_text()
