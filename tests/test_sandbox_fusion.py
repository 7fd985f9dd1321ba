"""SandboxFusion's own client (``sandbox-fusion`` on PyPI) against ``credo sandbox serve``: the /run_code contract.

One server per module on a free loopback port. The client validates its requests itself, so what it cannot send
(a missing ``code``, a wrong type, an unknown language) is posted raw and must be answered 422.
"""
from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_fusion import (
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
    SummaryMapping,
    run_code,
    set_endpoint,
    summary_run_code_result,
)

from credo.sandbox.languages import get_language
from credo.sandbox.worker import missing_toolchain
from tests.env_util import post_json
from tests.sandbox_util import make_sandbox

REPO = Path(__file__).resolve().parents[1]
SUMMARY = SummaryMapping(CompileFailed="CE", CompileTimeout="CTLE", RunFailed="RE", RunTimeout="TLE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has(language: str) -> bool:
    return missing_toolchain(get_language(language)) is None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def url():
    make_sandbox(1).close()  # skips where isolation cannot exist here
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "sandbox", "serve", "--port", str(port),
                             "--workers", "2"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        code, _ = _get(base + "/health")
        if code == 200:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("sandbox server did not start: " + proc.stderr.read().decode()[-2000:])
    set_endpoint(base)  # the client's module-wide endpoint; the tests also pass it explicitly
    yield base
    proc.terminate()
    proc.wait(timeout=10)


def _get(url: str) -> tuple[int, object]:
    try:
        return post_json(url, timeout=2)
    except OSError:
        return 0, None


def _run(url: str, **fields):
    """The client's run_code, one attempt (a SandboxError raises)."""
    return run_code(RunCodeRequest(**fields), endpoint=url, max_attempts=1, client_timeout=60)


def test_python_stdin_success_and_times(url):
    resp = _run(url, code="print(int(input()) * 2)", language="python", stdin="21\n")
    assert resp.status == RunStatus.Success and resp.compile_result is None and resp.files == {}
    run = resp.run_result
    assert run.status == "Finished" and run.return_code == 0 and run.stdout == "42\n" and run.stderr == ""
    assert isinstance(run.execution_time, float) and run.execution_time > 0
    assert isinstance(run.cpu_time, float) and run.cpu_time > 0
    assert summary_run_code_result(resp, SUMMARY) == SUMMARY.Success


def test_nonzero_exit_and_signal_are_finished_with_the_return_code(url):
    resp = _run(url, code="import sys\nprint('partial')\nsys.exit(3)", language="python")
    assert resp.status == RunStatus.Failed and resp.run_result.status == "Finished"
    assert resp.run_result.return_code == 3 and resp.run_result.stdout == "partial\n"
    assert summary_run_code_result(resp, SUMMARY) == "RE"
    resp = _run(url, code="import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", language="python")
    assert resp.run_result.status == "Finished" and resp.run_result.return_code == -11


def test_memory_and_output_limits_are_finished_nonzero(url):
    # the client's RunCodeRequest has no memory_limit_MB (SandboxFusion's server has): posted raw
    code, body = post_json(url + "/run_code", {"code": "x = b'x' * (512 << 20)\nprint(len(x))", "language": "python",
                                               "memory_limit_MB": 64})
    resp = RunCodeResponse(**body)
    assert resp.status == RunStatus.Failed and resp.run_result.status == "Finished"
    assert resp.run_result.return_code not in (0, None) and "memory limit" in resp.message
    resp = _run(url, code="import sys\nsys.stdout.write('x' * (4 << 20))", language="python")
    assert resp.status == RunStatus.Failed and resp.run_result.status == "Finished"
    assert resp.run_result.return_code not in (0, None) and "output limit" in resp.message


def test_python_syntax_error_is_a_run_with_return_code_1(url):
    resp = _run(url, code="def f(:\n    pass", language="python")
    assert resp.status == RunStatus.Failed and resp.compile_result is None
    assert resp.run_result.status == "Finished" and resp.run_result.return_code == 1
    assert "SyntaxError" in resp.run_result.stderr


def test_run_timeout_is_wall_clock(url):
    resp = _run(url, code="import time\ntime.sleep(30)", language="python", run_timeout=1)
    run = resp.run_result
    assert resp.status == RunStatus.Failed and run.status == "TimeLimitExceeded" and run.return_code is None
    assert resp.message == "wall-clock limit 1 s" and run.execution_time >= 1.0 and run.cpu_time < 1.0
    assert summary_run_code_result(resp, SUMMARY) == "TLE"


def test_files_in_and_fetch_files_out(url):
    code = ("import os\n"
            "print(open('data/in.txt').read().upper())\n"
            "os.makedirs('out', exist_ok=True)\n"
            "open('out/result.bin', 'wb').write(bytes(range(256)))\n"
            "open('data/in.txt', 'a').write('+more')\n"
            "os.symlink('/etc/hostname', 'leak')\n")
    resp = _run(url, code=code, language="python",
                files={"data/in.txt": _b64(b"hello"), "skipped.txt": None, "x_IGNORE_THIS_FILE": _b64(b"no")},
                fetch_files=["out/result.bin", "data/in.txt", "missing.txt", "leak", "out"])
    assert resp.status == RunStatus.Success, resp
    assert resp.run_result.stdout == "HELLO\n"
    assert set(resp.files) == {"out/result.bin", "data/in.txt"}  # missing, symlink, directory: left out
    assert base64.b64decode(resp.files["out/result.bin"]) == bytes(range(256))
    assert base64.b64decode(resp.files["data/in.txt"]) == b"hello+more"
    resp = _run(url, code="import os\nprint(sorted(os.listdir('.')))", language="python",
                files={"skipped.txt": None, "x_IGNORE_THIS_FILE": _b64(b"no"), "a.txt": _b64(b"")})
    assert resp.run_result.stdout == "['a.txt', 'main.py']\n"


@pytest.mark.skipif(not _has("cpp"), reason="no g++ on this machine")
def test_cpp_compiles_with_input_files_and_reports_compile_results(url):
    header = _b64(b"inline int twice(int x) { return 2 * x; }\n")
    resp = _run(url, code='#include <cstdio>\n#include "lib/twice.h"\nint main(){int x; scanf("%d",&x);'
                          ' printf("%d\\n", twice(x)); FILE*f=fopen("o.txt","w"); fputs("ok",f); fclose(f);}',
                language="cpp", stdin="21", files={"lib/twice.h": header}, fetch_files=["o.txt"])
    assert resp.status == RunStatus.Success, resp
    assert resp.compile_result.status == "Finished" and resp.compile_result.return_code == 0
    assert resp.run_result.stdout == "42\n" and base64.b64decode(resp.files["o.txt"]) == b"ok"
    resp = _run(url, code="int main( {", language="cpp")
    assert resp.status == RunStatus.Failed and resp.run_result is None
    assert resp.compile_result.status == "Finished" and resp.compile_result.return_code not in (0, None)
    assert "error" in resp.compile_result.stderr and summary_run_code_result(resp, SUMMARY) == "CE"


@pytest.mark.skipif(not _has("cpp"), reason="no g++ on this machine")
def test_compile_timeout_is_honoured_and_not_cached(url):
    code = "#include <bits/stdc++.h>\nint main(){std::cout << \"compiled\" << std::endl;}  // fusion-ct"
    resp = _run(url, code=code, language="cpp", compile_timeout=0.2)
    assert resp.status == RunStatus.Failed and resp.run_result is None
    assert resp.compile_result.status == "TimeLimitExceeded" and resp.compile_result.return_code is None
    assert summary_run_code_result(resp, SUMMARY) == "CTLE"
    resp = _run(url, code=code, language="cpp", compile_timeout=60)  # a timeout is never cached as the verdict
    assert resp.status == RunStatus.Success and resp.run_result.stdout == "compiled\n"


@pytest.mark.parametrize("language,code,stdout", [
    ("bash", 'read x; echo "got $x"', "got 7\n"),
    ("nodejs", "const s = require('fs').readFileSync(0, 'utf8'); console.log('got ' + s.trim())", "got 7\n"),
])
def test_bash_and_node(url, language, code, stdout):
    if not _has({"nodejs": "javascript"}.get(language, language)):
        pytest.skip(f"no {language} toolchain on this machine")
    resp = _run(url, code=code, language=language, stdin="7\n")
    assert resp.status == RunStatus.Success and resp.run_result.stdout == stdout


def test_missing_toolchain_and_unsupported_language_are_sandbox_errors(url):
    absent = [lang for lang in ("go", "rust", "java") if not _has(lang)]
    for language in absent[:1]:
        with pytest.raises(Exception, match="Sandbox responded with error: the .* toolchain is not installed"):
            _run(url, code="fn main() {}", language=language)
    with pytest.raises(Exception, match="Sandbox responded with error: credo's sandbox does not run php"):
        _run(url, code="<?php echo 1;", language="php")
    code, body = post_json(url + "/run_code", {"code": "+", "language": "brainfuck"})
    assert code == 422 and body["detail"].startswith("language must be one of SandboxFusion's languages")


@pytest.mark.parametrize("body,field", [
    ({"language": "python"}, "code"),
    ({"code": "print(1)"}, "language"),
    ({"code": 5, "language": "python"}, "code"),
    ({"code": "print(1)", "language": "python", "stdin": 5}, "stdin"),
    ({"code": "print(1)", "language": "python", "run_timeout": "10"}, "run_timeout"),
    ({"code": "print(1)", "language": "python", "compile_timeout": "x"}, "compile_timeout"),
    ({"code": "print(1)", "language": "python", "compile_timeout": 0}, "compile_timeout"),
    ({"code": "print(1)", "language": "python", "memory_limit_MB": "big"}, "memory_limit_MB"),
    ({"code": "print(1)", "language": "python", "files": ["a.txt"]}, "files"),
    ({"code": "print(1)", "language": "python", "files": {"a.txt": 5}}, "files['a.txt']"),
    ({"code": "print(1)", "language": "python", "files": {"a.txt": "%%%"}}, "files['a.txt']"),
    ({"code": "print(1)", "language": "python", "fetch_files": {"a": 1}}, "fetch_files"),
    ({"code": "print(1)", "language": "python", "fetch_files": [5]}, "fetch_files[0]"),
])
def test_missing_or_mistyped_fields_are_422(url, body, field):
    code, answer = post_json(url + "/run_code", body)
    assert code == 422, answer
    assert answer["detail"].split(" ")[0] == field, answer


@pytest.mark.parametrize("files,fetch", [
    ({"../escape.txt": "eA=="}, []),
    ({"/tmp/abs.txt": "eA=="}, []),
    ({"a/../../escape.txt": "eA=="}, []),
    ({"a//b.txt": "eA=="}, []),
    ({".": "eA=="}, []),
    ({"a\0b": "eA=="}, []),
    ({"d": "eA==", "d/e.txt": "eA=="}, []),
    ({"main.py": "eA=="}, []),
    ({}, ["../../etc/passwd"]),
    ({}, ["/etc/passwd"]),
])
def test_hostile_paths_are_422_and_nothing_is_written(url, files, fetch):
    before = set(Path("/tmp").iterdir())
    code, answer = post_json(url + "/run_code", {"code": "print(1)", "language": "python", "files": files,
                                                 "fetch_files": fetch})
    assert code == 422 and answer["detail"].split(" ")[0].startswith(("files", "fetch_files")), answer
    assert not any(p.name in ("abs.txt", "escape.txt") for p in set(Path("/tmp").iterdir()) - before)


def test_ping_and_response_shape(url):
    code, body = post_json(url + "/v1/ping", timeout=5)
    assert code == 200 and body == "pong"
    code, body = post_json(url + "/run_code", {"code": "print(1)", "language": "python", "unknown_field": 1})
    assert code == 200 and set(body) == {"status", "message", "compile_result", "run_result", "executor_pod_name",
                                         "files"}
    assert set(body["run_result"]) == {"status", "execution_time", "cpu_time", "return_code", "stdout", "stderr"}
