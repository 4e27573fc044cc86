"""The loopback servers that tests and benchmarks read from keep the listen backlog of a
store: socketserver's default of 5 dropped the connections of a burst past it (a feed's 16
lanes, 32 footers read at once), and the client's kernel sent each dropped SYN again a
second later. A Hub listing of 32 Parquet shards took 0.25 s or 1.25 s from run to run, the
same requests: one of the 32 footer reads held 1 s.

Each server is made listening and not yet accepting (as while its threads are busy), and a
burst of connections must all be queued."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingest.tools.forward import ForwardingHandler, ForwardingServer
from ingest.tools.loopback.http import LoopbackHTTP
from tests.hub_stub import HubStub

BURST = 32


def _http(tmp_path: Path) -> Any:
    return LoopbackHTTP(tmp_path)._server  # listening: its thread starts in `with`


def _hub(tmp_path: Path) -> Any:
    return HubStub().server()


def _forward(tmp_path: Path) -> Any:
    return ForwardingServer(0, "http://127.0.0.1:9", ForwardingHandler)


@pytest.mark.parametrize("make", [_http, _hub, _forward], ids=["http", "hub", "forward"])
def test_a_burst_of_connections_is_queued_before_it_is_accepted(
    make: Callable[[Path], Any], tmp_path: Path
) -> None:
    server = make(tmp_path)
    connected: list[socket.socket] = []
    try:
        for _ in range(BURST):
            try:  # a dropped SYN is sent again after 1 s: 0.5 s is a drop
                connected.append(socket.create_connection(server.server_address, timeout=0.5))
            except OSError:
                break
        assert len(connected) == BURST, f"{len(connected)} connections of {BURST} queued"
    finally:
        for s in connected:
            s.close()
        server.server_close()
