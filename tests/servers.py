"""Real servers for tests: a Prefect server on loopback and process workers, started and stopped by the test."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
PREFECT = str(Path(sys.executable).with_name("prefect"))
FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_MIGRATED: list[Path] = []  # the session's one migrated Prefect database, made on first use
_MIGRATED_LOCK = threading.Lock()


def prefect_home(path: Path) -> Path:
    """`path` as a fresh PREFECT_HOME whose SQLite database is already migrated: a copy of one that
    `prefect server database upgrade` made once for the session. A temporary or a started server in it runs the
    same migrations check and finds nothing to do, instead of creating the schema again (about 13 s of each
    fresh home's first server start on a 2-core machine). Returns `path`."""
    with _MIGRATED_LOCK:
        if not _MIGRATED:
            template = Path(tempfile.mkdtemp(prefix="batchgen-test-prefect-db-"))
            env = {**os.environ, "PREFECT_HOME": str(template)}
            for name in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_TEST_MODE"):
                env.pop(name, None)
            done = subprocess.run([PREFECT, "--no-prompt", "server", "database", "upgrade", "-y"], env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and (template / "prefect.db").is_file(), done.stdout + done.stderr
            _MIGRATED.append(template / "prefect.db")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "prefect.db").exists():
        shutil.copyfile(_MIGRATED[0], path / "prefect.db")
    return path


def _stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM the process group (a worker's flow-run processes and their engines too), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class PrefectServer:
    """`prefect server start` on 127.0.0.1 with its own PREFECT_HOME (SQLite unless a database URL is given)."""

    def __init__(self, home: Path, log_name: str, env: dict[str, str] | None = None):
        self.home = Path(home)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"{self.url}/api"
        self.log = ARTIFACTS / log_name
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None

    def env(self, **more: str) -> dict[str, str]:
        """The environment for a process that talks to this server."""
        env = {**os.environ, "PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api_url,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **self.extra_env, **more}
        env.pop("PREFECT_TEST_MODE", None)
        return env

    def start(self, timeout: float = 180) -> "PrefectServer":
        if "PREFECT_API_DATABASE_CONNECTION_URL" in self.extra_env:  # PostgreSQL: the server migrates it
            self.home.mkdir(parents=True, exist_ok=True)
        else:
            prefect_home(self.home)
        ARTIFACTS.mkdir(exist_ok=True)
        env = self.env(
            # Fire schedules and notice new deployments within seconds, not the default minute.
            PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5",
            PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS="2",
            PREFECT_UI_API_URL=self.api_url,
        )
        env.pop("PREFECT_API_URL")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}; see {self.log}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"prefect server did not answer in {timeout} s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def client(self):
        """A synchronous Prefect client for this server (use as a context manager)."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        @contextlib.contextmanager
        def connect():
            with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
                with get_client(sync_client=True) as client:
                    yield client

        return connect()

    def prefect(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        """Run the `prefect` command line against this server, from the project folder."""
        return subprocess.run([PREFECT, "--no-prompt", *args], env=self.env(**env), cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)


@contextlib.contextmanager
def worker(server: PrefectServer, pool: str, name: str, **env: str) -> Iterator[subprocess.Popen]:
    """`prefect worker start` in its own process group; stopped (with its flow runs) on exit."""
    log = ARTIFACTS / f"{name}.log"
    ARTIFACTS.mkdir(exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool, "--name", name, "--limit", "1"],
            env=server.env(PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="5", **env),
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        _stop(proc)


def wait_for_flow_run(client, flow_run_id, timeout: float = 900, log: Path | None = None):
    """Poll until the flow run reaches a final state; returns the flow run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.type.value in FINAL_STATES:
            return run
        time.sleep(2)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"flow run {flow_run_id} not finished in {timeout} s (state {run.state}):\n{tail}")


class Postgres:
    """Debian's PostgreSQL on loopback in a temporary data folder, run as the `postgres` user when we are root."""

    BIN = Path("/usr/lib/postgresql/15/bin")

    def __init__(self):
        import tempfile

        # Its own folder under /tmp: the postgres user cannot enter root's pytest folders.
        self.data = Path(tempfile.mkdtemp(prefix="batchgen-pg-"))
        self.port = free_port()
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"

    def _run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120, check=True, **kwargs)

    def start(self) -> "Postgres":
        if os.geteuid() == 0:
            import shutil

            shutil.chown(self.data, "postgres", "postgres")
            self.data.chmod(0o700)
        self._run(str(self.BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust")
        self._run(str(self.BIN / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.data / "server.log"),
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start")
        self._run(str(self.BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "prefect")
        return self

    def query(self, sql: str) -> str:
        return self._run(str(self.BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",
                         "prefect", "-At", "-c", sql).stdout.strip()

    def stop(self) -> None:
        import shutil

        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(str(self.BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def moto_s3(log: Path, buckets: tuple[str, ...] = ()) -> Iterator[str]:
    """moto's S3 server (`python -m moto.server`) on a free loopback port, with `buckets` created.

    Yields the endpoint URL. While it runs, the AWS_* variables pyarrow and boto3 read point at it
    (test credentials, AWS_ENDPOINT_URL); they are restored and the server stopped afterwards.
    """
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}
    saved = {key: os.environ.get(key) for key in env}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    os.environ.update(env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {endpoint}: {log.read_text(errors='replace')}")
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint)
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        _stop(proc, timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
