"""A server run as a child process (:mod:`ingest.tools.child`): started until it answers,
stopped at the end of its ``with`` block, and clear errors when it cannot start."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ingest.tools.child import ChildServer


class _Python(ChildServer):
    """``python -c CODE PORT``, answering when ``GET /`` does."""

    name = "the test child"

    def __init__(self, code: str, start_timeout_s: float = 30.0) -> None:
        super().__init__(start_timeout_s=start_timeout_s)
        self.code = code

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code, str(self.port)]

    def ping(self) -> None:
        urllib.request.urlopen(self.endpoint, timeout=1).close()


SERVE = (
    "import sys, http.server\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), "
    "http.server.SimpleHTTPRequestHandler).serve_forever()"
)


def test_a_child_answers_in_its_block_and_is_gone_after_it() -> None:
    with _Python(SERVE) as child:
        assert urllib.request.urlopen(child.endpoint, timeout=10).status == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(child.endpoint, timeout=10)


def test_a_child_that_exits_while_starting_says_with_what() -> None:
    with pytest.raises(RuntimeError, match="the test child exited with 3"):
        _Python("raise SystemExit(3)").start()


def test_a_child_that_never_answers_is_stopped_and_named(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    child = _Python(code, start_timeout_s=2)
    with pytest.raises(TimeoutError, match=rf"the test child did not answer on {child.endpoint}"):
        child.start()
    with pytest.raises(ProcessLookupError):  # terminated and reaped
        os.kill(int(pid_file.read_text()), 0)
