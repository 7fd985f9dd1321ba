"""SandboxFusion's own client (``sandbox-fusion`` on PyPI) against ``credo sandbox serve``: the /run_code contract.

One server per module on a free loopback port. The client validates its requests itself, so what it cannot send
(a missing ``code``, a wrong type, an unknown language) is posted raw and must be answered 422.
"""
from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
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

from credo.sandbox import workfiles
from credo.sandbox.languages import get_language
from credo.sandbox.limits import FieldError, LimitCaps
from credo.sandbox.server import fusion_request
from credo.sandbox.worker import missing_toolchain
from tests.env_util import post_json
from tests.sandbox_util import ONE_POOL_AT_A_TIME, make_sandbox

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

REPO = Path(__file__).resolve().parents[2]
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
def server_tmp():
    """The server's $TMPDIR (its pool's root lies below it), traversable by the per-run uids."""
    path = Path(tempfile.mkdtemp(prefix="credo-fusion-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def url(server_tmp):
    make_sandbox(1).close()  # skips where isolation cannot exist here
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(server_tmp), "NO_PROXY": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "sandbox", "serve", "--port", str(port),
                             "--workers", "2"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1")  # the client (requests) and post_json (urllib) honour proxies
        mp.setenv("no_proxy", "127.0.0.1")
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
def test_hostile_paths_are_422_and_nothing_is_written(url, server_tmp, files, fetch):
    before = set(Path("/tmp").iterdir())
    assert not Path("/tmp/abs.txt").exists()
    code, answer = post_json(url + "/run_code", {"code": "print(1)", "language": "python", "files": files,
                                                 "fetch_files": fetch})
    assert code == 422 and answer["detail"].split(" ")[0].startswith(("files", "fetch_files")), answer
    assert not any(p.name in ("abs.txt", "escape.txt") for p in set(Path("/tmp").iterdir()) - before)
    # where an absolute or '../' write would land: /tmp/abs.txt, and the pool's directories (job, worker, root)
    roots = list(server_tmp.glob("credo-sandbox-*"))
    assert len(roots) == 1 and (roots[0] / "w0").is_dir()
    assert not Path("/tmp/abs.txt").exists()
    assert not [p for p in server_tmp.rglob("*") if p.name in ("abs.txt", "escape.txt")]


def test_ping_and_response_shape(url):
    code, body = post_json(url + "/v1/ping", timeout=5)
    assert code == 200 and body == "pong"
    code, body = post_json(url + "/run_code", {"code": "print(1)", "language": "python", "unknown_field": 1})
    assert code == 200 and set(body) == {"status", "message", "compile_result", "run_result", "executor_pod_name",
                                         "files"}
    assert set(body["run_result"]) == {"status", "execution_time", "cpu_time", "return_code", "stdout", "stderr"}


def test_fetch_files_many_long_quoted_paths_do_not_overflow_the_command_line(url):
    code = "import os\nopen(\"it's\", 'w').write('q')\nopen('--to-command=touch pwned', 'w').write('d')"
    paths = ["'" * 1000 + f"{i}" for i in range(62)] + ["it's", "--to-command=touch pwned"]
    resp = _run(url, code=code, language="python", fetch_files=paths)
    assert resp.status == RunStatus.Success, resp  # 64 paths of 1000 quotes: >128 KiB if pasted into argv
    assert resp.files == {"it's": _b64(b"q"), "--to-command=touch pwned": _b64(b"d")}


def test_program_stderr_is_its_own_with_fetch_files(url):
    code = ("import os, signal, sys\nsys.stderr.write('mine\\n'); sys.stderr.flush()\n"
            "os.kill(os.getpid(), signal.SIGSEGV)")
    resp = _run(url, code=code, language="python", fetch_files=["none.txt"])
    assert resp.run_result.return_code == -11 and resp.run_result.stderr == "mine\n", resp


def test_hard_links_and_a_symlinked_parent_dir_come_back(url):
    code = ("import os\nos.makedirs('real')\nopen('real/f', 'w').write('x')\nos.symlink('real', 'alias')\n"
            "open('a', 'w').write('same')\nos.link('a', 'b')\n")
    resp = _run(url, code=code, language="python", fetch_files=["a", "b", "alias/f", "alias"])
    assert resp.status == RunStatus.Success, resp
    # hard links as whole files; a symlinked parent is followed inside the sandbox (the program's own view)
    assert resp.files == {"a": _b64(b"same"), "b": _b64(b"same"), "alias/f": _b64(b"x")}


def test_at_most_max_files_inputs_and_fetched_paths(url):
    many = {f"d/f{i}.txt": _b64(str(i).encode()) for i in range(workfiles.MAX_FILES)}
    resp = _run(url, code="print(1)", language="python", files=many, fetch_files=sorted(many))
    assert resp.status == RunStatus.Success and len(resp.files) == workfiles.MAX_FILES
    assert base64.b64decode(resp.files["d/f63.txt"]) == b"63"
    over = {**many, "extra.txt": _b64(b"x")}
    code, answer = post_json(url + "/run_code", {"code": "print(1)", "language": "python", "files": over})
    assert code == 422 and answer["detail"] == f"files has {workfiles.MAX_FILES + 1} files, more than 64", answer
    code, answer = post_json(url + "/run_code", {"code": "print(1)", "language": "python",
                                                 "fetch_files": [f"p{i}" for i in range(workfiles.MAX_FILES + 1)]})
    assert code == 422 and answer["detail"].startswith("fetch_files has 65 paths"), answer


def test_fetched_files_over_max_fetch_bytes_none_come_back(url):
    size = 12 << 20  # each under the default 16 MiB file-size limit; three are over the 32 MiB cap
    code = f"for n in 'abc':\n    open(n, 'wb').write(b'z' * {size})\nprint('done')"
    resp = _run(url, code=code, language="python", fetch_files=["a", "b", "c"])
    assert resp.status == RunStatus.Success and resp.run_result.stdout == "done\n" and resp.files == {}
    resp = _run(url, code=code, language="python", fetch_files=["a", "b"])
    assert set(resp.files) == {"a", "b"} and len(base64.b64decode(resp.files["b"])) == size


def test_input_files_over_max_input_bytes_are_refused():
    chunk = "A" * (12 << 20)  # valid base64, 9 MiB decoded each; four make 36 MiB
    with pytest.raises(FieldError, match="files are larger than 33554432 bytes in all"):
        workfiles.check_inputs({f"f{i}": chunk for i in range(4)})
    assert len(workfiles.check_inputs({f"f{i}": chunk for i in range(3)})) == 3


def test_input_file_over_the_file_size_limit_and_paths_under_the_program_are_422(url):
    big = _b64(b"x" * ((16 << 20) + 1))  # tar -x runs under the program's RLIMIT_FSIZE (16 MiB by default)
    with pytest.raises(FieldError, match=r"files\['big.bin'\] is 16777217 bytes, over the file-size limit"):
        fusion_request({"code": "print(1)", "language": "python", "files": {"big.bin": big}}, LimitCaps())
    code, answer = post_json(url + "/run", {"source": "print(1)", "language": "python",
                                            "limits": {"file_size_mb": 1}, "files": {"a.bin": _b64(b"y" * (2 << 20))}})
    assert code == 422 and answer["detail"].startswith("files['a.bin'] is 2097152 bytes"), answer
    for path in ("main.py/x", "main.py/a/b.txt"):
        code, answer = post_json(url + "/run_code", {"code": "print(1)", "language": "python",
                                                     "files": {path: _b64(b"x")}})
        assert code == 422 and "the program's own file" in answer["detail"], answer
    code, answer = post_json(url + "/run", {"source": "print(1)", "files": {"main.cpp": _b64(b"x")}})
    assert code == 422 and "the program's own file" in answer["detail"], answer  # detected later: every language


def test_compile_timeout_is_capped_by_the_server(url):
    for body, route, field in ((({"code": "int main(){}", "language": "cpp", "compile_timeout": 100}), "/run_code",
                                "compile_timeout=100"),
                               ({"source": "int main(){}", "language": "cpp", "compile_timeout_s": 61}, "/run",
                                "compile_timeout_s=61"),
                               ({"source": "int main(){}", "language": "cpp", "tests": [],
                                 "compile_timeout_s": 61}, "/judge", "compile_timeout_s=61")):
        code, answer = post_json(url + route, body)
        assert code == 422 and answer["detail"] == f"{field} exceeds the server maximum 60", answer
    low = LimitCaps(compile_time_s=4.0)
    assert fusion_request({"code": "x", "language": "cpp"}, low).compile_timeout_s == 4.0  # the default 10, lowered
    with pytest.raises(FieldError, match="compile_timeout=5 exceeds the server maximum 4"):
        fusion_request({"code": "x", "language": "cpp", "compile_timeout": 5}, low)


@pytest.mark.skipif(not _has("cpp"), reason="no g++ on this machine")
def test_compile_timeout_is_cached_with_its_limit(url):
    code = "#include <bits/stdc++.h>\nint main(){std::cout << \"compiled\" << std::endl;}  // fusion-cached-tle"
    first = _run(url, code=code, language="cpp", compile_timeout=0.2)
    assert first.compile_result.status == "TimeLimitExceeded" and first.message.endswith(" 0.2 s"), first
    again = _run(url, code=code, language="cpp", compile_timeout=0.1)  # smaller: the cached timeout, not a compile
    assert again.compile_result.status == "TimeLimitExceeded" and again.message == first.message
    assert again.compile_result.execution_time == first.compile_result.execution_time
    same = _run(url, code=code, language="cpp", compile_timeout=0.2)
    assert same.message == first.message and same.compile_result.execution_time == first.compile_result.execution_time
    resp = _run(url, code=code, language="cpp", compile_timeout=60)  # larger: compiled afresh
    assert resp.status == RunStatus.Success and resp.run_result.stdout == "compiled\n"
