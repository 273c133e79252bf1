"""The archive TTL: one default for the CLI, the chart and the server; no negative TTL."""

from __future__ import annotations

import pytest

from coordinator.recordarchive import DEFAULT_TTL_S, RecordArchive
from coordinator.server import ServerSettings
from lazarus.cli.servers import ARCHIVE_TTL_S


def test_the_cli_default_is_the_archives() -> None:
    assert (
        ARCHIVE_TTL_S
        == DEFAULT_TTL_S
        == ServerSettings(cluster="c", member_id="m", auth="none").archive_ttl_s
    )
    assert DEFAULT_TTL_S > 0  # bounded by default: Redis does not grow with every task ever run


def test_a_negative_ttl_is_refused_saying_what_zero_means() -> None:
    with pytest.raises(ValueError, match="0 keeps records forever"):
        ServerSettings(cluster="c", member_id="m", auth="none", archive_ttl_s=-1)
    with pytest.raises(ValueError, match="0: forever"):
        RecordArchive(client=None, cluster="c", ttl_s=-1)  # type: ignore[arg-type]
