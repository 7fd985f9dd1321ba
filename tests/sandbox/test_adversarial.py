"""The adversarial suite: every hostile program gets its expected verdict and the host is unharmed.

Host checks after each program and after the whole suite: canary files unchanged (and unreadable to
the programs), no process of a run left alive, no host loopback connection accepted, no file owned by
a sandbox uid left on the host, the host's secret environment variable never printed, the sandbox's
job directories emptied.

The suite runs in both sandbox modes (.ci/run runs it again as an unprivileged user, in rootless mode). In
rootless mode runs keep the user's uid, so the checks that find sandbox processes and files by uid do not
apply there (skipped with that reason); the process-tree check below applies in both modes.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from credo.sandbox import Limits
from credo.sandbox.proctree import descendants
from credo.sandbox.results import JudgeRequest, RunRequest
from tests.sandbox.adversarial_programs import PROGRAMS, Hostile
from tests.sandbox_util import ONE_POOL_AT_A_TIME, ROOTLESS

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

NO_UID_DROP = "rootless mode keeps the user's uid (no uid drop): sandbox processes and files have no uid of their own"

UID_RANGE = range(61000, 61100)


class LoopbackServer:
    """A TCP + UDP listener on the host's loopback that records every connection or datagram."""

    def __init__(self):
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.hits: list[str] = []
        self.tcp.settimeout(0.2)
        self.udp.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            for sock, kind in ((self.tcp, "tcp"), (self.udp, "udp")):
                try:
                    if kind == "tcp":
                        conn, addr = sock.accept()
                        conn.close()
                    else:
                        _, addr = sock.recvfrom(100)
                    self.hits.append(f"{kind} from {addr}")
                except OSError:
                    pass

    def close(self):
        self._stop = True
        self._thread.join(timeout=2)
        self.tcp.close()
        self.udp.close()


def sandbox_processes() -> list[str]:
    """Processes on the host running as a sandbox uid (there must be none between runs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" in status:  # an exited process waiting to be reaped is not alive
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        uids = [int(x) for x in uid_line.split()[1:]]
        if any(u in UID_RANGE for u in uids):
            found.append(f"{entry.name}: {status.splitlines()[0]}")
    return found


def run_leftovers(sandbox) -> list[str]:
    """Processes a finished run left under the pool's workers: a bwrap, or anything in another PID namespace
    (what the programs run in). Works in both modes: it looks at the process tree, not at uids."""
    own_ns = os.readlink("/proc/self/ns/pid")
    workers = [slot.proc.pid for slot in sandbox._slots if slot.proc is not None]
    found = []
    for pid in {p for w in workers for p in descendants(w)} - set(workers):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            ns = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        name = status.splitlines()[0].split(":", 1)[1].strip()
        if "State:\tZ" not in status and (name == "bwrap" or ns != own_ns):
            found.append(f"{pid}: {name}")
    return found


def sandbox_owned_files(roots: list[Path]) -> list[str]:
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: None):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                try:
                    if path.lstat().st_uid in UID_RANGE:
                        out.append(str(path))
                except OSError:
                    pass
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    secret = "credo-secret-" + secrets.token_hex(8)
    canaries = [Path("/var/tmp") / f"credo-canary-{secrets.token_hex(4)}.txt",  # given to programs by path
                Path("/tmp") / f"credo-canary-{secrets.token_hex(4)}.txt",
                tmp_path_factory.mktemp("canary") / "canary.txt"]
    for c in canaries:
        c.write_text(secret)
        os.chmod(c, 0o600)
    digests = {c: _digest(c) for c in canaries}
    os.environ["CREDO_HOST_SECRET"] = secret
    server = LoopbackServer()
    bystander = subprocess.Popen(["sleep", "600"])  # a host process a hostile kill(-1) must not reach
    yield {"secret": secret, "canaries": canaries, "digests": digests, "server": server, "bystander": bystander}
    server.close()
    bystander.kill()
    os.environ.pop("CREDO_HOST_SECRET", None)
    for c in canaries:
        c.unlink(missing_ok=True)


def _request(prog: Hostile, host) -> JudgeRequest | RunRequest:
    source = prog.source.replace("{PORT}", str(host["server"].port)).replace("{CANARY}", str(host["canaries"][0]))
    limits = Limits(time_s=prog.time_s, memory_mb=prog.memory_mb, output_bytes=1 << 16, wall_factor=3.0)
    if prog.fn_name:
        return JudgeRequest(source=source, language=prog.language, tests=[{"args": [2, 3], "expected_return": 5}],
                            limits=limits, fn_name=prog.fn_name)
    return RunRequest(source=source, language=prog.language, limits=limits)


def test_suite_is_large_and_covers_every_language():
    assert len(PROGRAMS) >= 40
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)
    assert {p.language for p in PROGRAMS} >= {"python", "c", "cpp", "javascript", "bash", "java"}


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_hostile_program(sandbox, host, prog):
    result = sandbox.submit(_request(prog, host)).result()
    verdict = result.verdict
    stdout = result.stdout if hasattr(result, "stdout") else "".join(t.stdout_head for t in result.tests)
    detail = (result.detail, getattr(result, "stderr", "")[-300:], stdout[:300])
    assert verdict in prog.verdicts, detail
    if prog.stdout_has:
        assert prog.stdout_has in stdout and "ALLOWED" not in stdout and "connected" not in stdout, detail
    assert host["secret"] not in stdout
    # host checks after every program
    time.sleep(0.05)
    assert run_leftovers(sandbox) == [], f"{prog.name} left processes behind"
    if not ROOTLESS:
        assert sandbox_processes() == [], f"{prog.name} left processes of a sandbox uid behind"
    assert host["server"].hits == [], f"{prog.name} reached the host loopback"
    assert host["bystander"].poll() is None, f"{prog.name} killed a host process"
    for c, digest in host["digests"].items():
        assert c.exists() and _digest(c) == digest, f"{prog.name} touched a canary"


@pytest.mark.skipif(ROOTLESS, reason=NO_UID_DROP)
def test_no_process_or_file_of_a_sandbox_uid_after_the_suite(sandbox, host):
    assert sandbox_processes() == []
    assert sandbox_owned_files([Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]) == []


def test_host_is_clean_after_the_suite(sandbox, host):
    assert run_leftovers(sandbox) == []
    assert not Path("/etc/credo_pwned").exists() and not Path("/usr/bin/credo_pwned").exists()
    # cache: compiled programs; bin: root mode's copy of bwrap where the per-run uids can reach it
    leftover = [p for p in sandbox.root.rglob("*") if not {"cache", "bin"} & set(p.parts) and p.is_file()]
    assert leftover == [], "job directories must be removed after each run"


def test_proc_shows_only_the_run(sandbox):
    r = sandbox.run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", "python",
                    limits=Limits(time_s=1.0))
    pids = eval(r.stdout)  # noqa: S307 - our own program's output
    assert r.verdict == "OK" and len(pids) <= 3 and max(pids) < 10
