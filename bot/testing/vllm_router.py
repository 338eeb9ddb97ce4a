"""vLLM's own router (``vllm-router``, the ``router`` extra) on loopback, in front of replicas.

For tests/remote/test_router.py and ``bench/affinity.py --router POLICY``: the
same binary an operator runs (``deploy/compose.yaml``'s ``router`` profile), a
Rust program shipped in its PyPI wheel, started here as a child process of its
own group so that a test can kill it with everything it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bot.testing.vllm_servers import free_port

START_TIMEOUT_S = 30.0
ROUTER_POLICIES = ("consistent_hash", "sticky_least_loaded", "cache_aware", "round_robin")
"""The policies the benchmark compares; the binary knows a few more (``--help``)."""


def router_binary() -> str:
    """``vllm-router`` beside this interpreter (a venv's ``bin/``), else on ``PATH``."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError(
            "vllm-router is not installed: `make router` (pip install -e '.[router]')"
        )
    return found


@dataclass
class VLLMRouter:
    port: int
    policy: str
    worker_urls: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


HEALTH_CHECK_ARGS = ("--health-check-interval-secs", "2", "--health-failure-threshold", "2")
"""A dead replica leaves the ring within about 4 s (the binary's default: 60 s x 3), as
deploy/compose.yaml's router does; until then its sessions' requests fail at the router."""


def start_router(
    worker_urls: list[str],
    log_dir: Path,
    *,
    policy: str = "consistent_hash",
    extra_args: tuple[str, ...] = HEALTH_CHECK_ARGS,
) -> VLLMRouter:
    """Start ``vllm-router`` over ``worker_urls`` and wait until its ``/health`` answers 200."""
    port = free_port()
    command = [
        router_binary(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        # Its Prometheus exporter listens on a port of its own (29000 by default): one
        # free port each, so that several routers run side by side.
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        *extra_args,
        "--worker-urls",
        *worker_urls,
    ]
    log_path = log_dir / f"vllm-router-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    router = VLLMRouter(port, policy, list(worker_urls), log_path, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm-router exited:\n{router.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{router.base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return router
        except OSError:
            pass
        time.sleep(0.2)
    router.stop()
    raise RuntimeError(f"vllm-router not healthy in {START_TIMEOUT_S} s:\n{router.log_text()}")
