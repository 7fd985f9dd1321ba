"""`credo sandbox serve` as a real process on a free loopback port: every endpoint, SandboxFusion shape, 429."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.env_util import post_json
from tests.sandbox_util import ONE_POOL_AT_A_TIME, make_sandbox

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    return post_json(f"http://127.0.0.1:{port}{path}", body, timeout=timeout)


@pytest.fixture(scope="module")
def server():
    make_sandbox(1).close()  # skips where isolation cannot exist here
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "sandbox", "serve", "--port", str(port),
                             "--workers", "1", "--max-queue", "2"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if json.loads(r.read())["status"] == "ok":
                    break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("sandbox server did not start: " + proc.stderr.read().decode()[-2000:])
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def test_health_run_and_judge(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/health") as r:
        health = json.loads(r.read())
    assert health["workers"] == 1 and health["unsafe"] is False
    code, body = _post(server, "/run", {"source": "print(input()*2)", "language": "python", "stdin": "ab\n"})
    assert code == 200 and body["verdict"] == "OK" and body["stdout"] == "abab\n"
    code, body = _post(server, "/judge", {"source": "print(int(input())+1)", "language": "python",
                                          "tests": [{"stdin": "1", "expected_stdout": "2"},
                                                    {"stdin": "5", "expected_stdout": "7"}],
                                          "limits": {"time_s": 1.0}})
    assert code == 200 and body["verdict"] == "WA" and body["passed"] == 1 and body["pass_rate"] == 0.5
    code, body = _post(server, "/judge_batch", {"requests": [
        {"source": "print(1)", "language": "python", "tests": [{"stdin": "", "expected_stdout": "1"}]},
        {"source": "int main(){return 1}", "language": "c", "tests": [{"stdin": "", "expected_stdout": "1"}]}]})
    assert code == 200 and [r["verdict"] for r in body["results"]] == ["AC", "CE"]
    code, body = _post(server, "/judge", {"tests": []})
    assert code == 422


def test_run_code_speaks_sandboxfusion(server):
    code, body = _post(server, "/run_code", {"code": "print('hello')", "language": "python", "compile_timeout": 10,
                                             "run_timeout": 10, "stdin": "", "files": {}, "fetch_files": []})
    assert code == 200 and body["status"] == "Success" and body["compile_result"] is None
    run = body["run_result"]
    assert run["status"] == "Finished" and run["return_code"] == 0 and run["stdout"] == "hello\n"
    assert isinstance(run["execution_time"], float)
    _, body = _post(server, "/run_code", {"code": "while True: pass", "language": "python", "run_timeout": 0.5})
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded"
    _, body = _post(server, "/run_code", {"code": "int main( {", "language": "cpp"})
    assert body["status"] == "Failed" and body["compile_result"]["status"] == "Finished"  # SandboxFusion's Error
    assert body["compile_result"]["return_code"] != 0 and body["run_result"] is None  # is the sandbox's failure
    _, body = _post(server, "/run_code", {"code": "x", "language": "php"})  # SandboxFusion's, not credo's
    assert body["status"] == "SandboxError"
    code, body = _post(server, "/run_code", {"code": "x", "language": "brainfuck"})  # nobody's: as SandboxFusion
    assert code == 422


def test_full_queue_answers_429(server):
    slow = {"source": "import time; time.sleep(30)", "language": "python",
            "limits": {"time_s": 0.5, "wall_factor": 3.0}}  # each blocks the single worker for ~2.5 s
    with ThreadPoolExecutor(6) as pool:
        codes = [f.result()[0] for f in [pool.submit(_post, server, "/run", slow) for _ in range(6)]]
    assert 429 in codes and 200 in codes
