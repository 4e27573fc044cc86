"""A server run as a child process on 127.0.0.1, for the life of a ``with`` block.

The loopback S3 server (:class:`ingest.tools.loopback.LoopbackS3`, ``moto_server``) and the
bench's counting proxy (:class:`ingest.tools.bench.proxy.CountingProxy`) run apart from the
processes they serve, so that serving never competes for their GIL. Both start a command,
wait until it answers, and stop it: terminated, and killed if it lingers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from types import TracebackType
from typing import ClassVar, TypeVar

_S = TypeVar("_S", bound="ChildServer")

POLL_S = 0.05
"""How often a starting child is asked whether it answers."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildServer:
    """A child process serving HTTP on 127.0.0.1 at :attr:`endpoint`.

    Subclasses give the command (:meth:`command`) and the question that tells it answers
    (:meth:`ping`).

    Args:
        port: Port the child binds; 0 picks a free one.
        env: Extra environment for the child.
        start_timeout_s: Longest wait for the child to answer.
    """

    name: ClassVar[str] = "the server"
    """What errors call the child."""
    hint: ClassVar[str] = ""
    """Said after "exited with N": how to install what is missing."""
    show_stderr: ClassVar[bool] = False
    """Whether the child's stderr is this process's (else it is dropped)."""

    def __init__(
        self, port: int = 0, env: dict[str, str] | None = None, start_timeout_s: float = 30.0
    ) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._env = env or {}
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The child's command line."""
        raise NotImplementedError

    def ping(self) -> None:
        """Return if the child answers; raise ``OSError`` (``URLError``) if not yet."""
        raise NotImplementedError

    def start(self: _S) -> _S:
        """Start the child and wait until it answers.

        Raises:
            RuntimeError: If the child exits while starting.
            TimeoutError: If it does not answer within ``start_timeout_s``.
        """
        self._proc = proc = subprocess.Popen(
            self.command(),
            env={**os.environ, **self._env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None if self.show_stderr else subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise RuntimeError(f"{self.name} exited with {proc.returncode}{self.hint}")
            try:
                self.ping()
                return self
            except OSError:
                time.sleep(POLL_S)
        self.stop()
        raise TimeoutError(
            f"{self.name} did not answer on {self.endpoint} within {self._start_timeout_s:.0f} s"
        )

    def stop(self) -> None:
        """Stop the child: terminated, and killed if it is still there after 10 s."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
