"""Without RLRUN_TEST_PG and with nothing on the port, the tests start a PostgreSQL of their own."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from tests import postgres


@pytest.mark.slow
def test_with_nothing_listening_a_throwaway_server_serves_the_session_and_goes_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLRUN_TEST_PG", raising=False)
    port = postgres.free_port()
    monkeypatch.setattr(postgres, "PORT", port)
    assert not postgres.answers(port)
    with postgres.admin_url() as url:
        assert f":{port}/" not in url  # not the (silent) default port: a server of its own
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text('CREATE DATABASE "scratch"'))
            assert conn.execute(text("SHOW server_version_num")).scalar()
        engine.dispose()
        server_port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert postgres.answers(server_port)
    assert not postgres.answers(server_port)
