"""Warm Python runs (credo.sandbox.zygote): the same results as cold runs, isolation between consecutive runs,
recovery from a dead zygote, and the Python programs of the adversarial suite run warm.

The adversarial host checks apply unchanged except that each worker's zygote (its bwrap, bwrap's init and the
interpreter, which never runs a program) is expected to stay alive between runs: what a run leaves behind is
looked for below the zygote (docs/sandbox.md#warm-python-runs).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from credo.sandbox import Limits, RunRequest, Sandbox, SandboxUnavailable
from credo.sandbox.proctree import descendants
from tests.sandbox.adversarial_programs import PROGRAMS
from tests.sandbox.test_adversarial import UID_RANGE, _digest, _request, host  # noqa: F401 - host is a fixture
from tests.sandbox_util import ONE_POOL_AT_A_TIME, ROOTLESS, isolation_missing

pytestmark = ONE_POOL_AT_A_TIME

ZYGOTE_MARK = "/tmp/.credo-zygote.py"
IS_WARM = "print(open('/proc/self/cmdline').read().split(chr(0))[4])"  # the zygote's script when warm


@pytest.fixture(scope="module")
def pools():
    try:
        warm, cold = Sandbox(workers=2, warm=True), Sandbox(workers=1, warm=False)
    except SandboxUnavailable as exc:
        if isolation_missing() is None:
            raise
        pytest.skip(f"sandbox isolation unavailable: {exc}")
    yield warm, cold
    warm.close()
    cold.close()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def zygotes(sandbox: Sandbox) -> list[int]:
    workers = [s.proc.pid for s in sandbox._slots if s.proc is not None]
    return [p for w in workers for p in descendants(w) if ZYGOTE_MARK in _cmdline(p) and "bwrap" not in _cmdline(p)]


def zygote_chain(sandbox: Sandbox) -> set[int]:
    """The bwrap, bwrap init and interpreter of every worker's zygote."""
    workers = [s.proc.pid for s in sandbox._slots if s.proc is not None]
    return {p for w in workers for p in descendants(w) if ZYGOTE_MARK in _cmdline(p)}


def warm_leftovers(sandbox: Sandbox) -> list[str]:
    """Live processes below a zygote: what a run left behind."""
    return [f"{p}: {_cmdline(p)[:60]}" for z in zygotes(sandbox) for p in descendants(z)[1:] if _alive(p)]


def uid_processes(exclude: set[int]) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "Uid:")
        if "State:\tZ" not in status and any(int(u) in UID_RANGE for u in uid_line.split()[1:]):
            found.append(f"{entry.name}: {status.splitlines()[0]}")
    return found


EQUIVALENCE = [
    ("print(sum(map(int, input().split())))", "3 4\n", Limits()),
    ("import sys\ndata = sys.stdin.read()\nprint(len(data), data.count('\\n'))", "a\nb\nc\n", Limits()),
    ("import sys\nprint(sys.argv, sys.flags.isolated, sys.flags.no_site, sys.path)\nprint(__name__, __file__)",
     "", Limits()),
    ("import sys\nprint(sorted(sys.modules))", "", Limits()),
    ("import os\nprint(os.getcwd(), os.getpid(), os.getppid(), sorted(os.environ.items()))\n"
     "print(sorted(os.listdir('/proc/self/fd')), sorted(os.listdir('/work')), os.listdir('/tmp'))", "", Limits()),
    ("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", "", Limits()),
    ("print(open('/proc/self/status').read().split('CapInh')[1].split('Speculation')[0])", "", Limits()),
    ("import sys\nprint(sys.stdin.seekable(), sys.stdout.line_buffering, sys.stderr.line_buffering,"
     " sys.stdout.encoding, sys.stdin.errors)", "", Limits()),
    ("raise ValueError('boom')", "", Limits()),
    ("import sys\nsys.exit(7)", "", Limits()),
    ("import sys\nsys.exit('bye')", "", Limits()),
    ("print(1", "", Limits()),
    ("import os\nos.kill(os.getpid(), 9)", "", Limits()),
    ("while True:\n    pass", "", Limits(time_s=0.5)),
    ("import time\ntime.sleep(30)", "", Limits(time_s=0.5, wall_time_s=1.0)),
    ("x = bytearray(600 << 20)\nprint(len(x))", "", Limits(memory_mb=128)),
    ("print('y' * (1 << 21))", "", Limits()),
    ("open('/work/main.py', 'w')", "", Limits()),
    ("import socket\nsocket.socket()", "", Limits()),
    # every process waits for its children: a run ends with its first process (on both paths)
    ("import os\nos.fork()\nos.fork()\nprint('forked')\ntry:\n    while True:\n        os.wait()\n"
     "except ChildProcessError:\n    pass", "", Limits()),
    ("import atexit\natexit.register(print, 'at exit')\nprint('body')", "", Limits()),
    ("import threading\nt = threading.Thread(target=lambda: print('thread'))\nt.start()", "", Limits()),
    # the exit: what the program made is finalized as CPython's exit does (the zygote's own heap is not)
    ("class A:\n    def __init__(self, n):\n        self.n = n\n    def __del__(self):\n        print('del', self.n)\n"
     "a, b = A(1), A(2)\n_c = A(3)\nprint('body')", "", Limits()),
    ("import os\nf = open(1, 'w', closefd=False)\nf.write('written, never flushed')", "", Limits()),
    ("import sys\nsys.stdout = open(1, 'w', closefd=False, buffering=4096)\nprint('through a new stdout')", "", Limits()),
    ("import os\nos.close(1)\nprint('lost')", "", Limits()),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\nprint('main')",
     "", Limits(wall_time_s=5.0)),
    ("import atexit, sys\natexit.register(print, 'registered first')\natexit.register(print, 'registered second')\n"
     "sys.exit(3)", "", Limits()),
    ("import json, collections\nclass D(collections.OrderedDict):\n    def __del__(self):\n"
     "        print('del', json.dumps(self))\nd = D(a=1)", "", Limits()),
]


@pytest.mark.parametrize("index", range(len(EQUIVALENCE)))
def test_warm_run_equals_cold_run(pools, index):
    warm, cold = pools
    source, stdin, limits = EQUIVALENCE[index]
    w, c = (pool.run(source, "python", stdin=stdin, limits=limits) for pool in pools)
    assert w.verdict == c.verdict, (w, c)
    if w.verdict != "OLE":  # past the output cap, the kill races the program's own exit on either path
        assert (w.exit_code, w.signal) == (c.exit_code, c.signal), (w, c)
    assert w.stdout == c.stdout and w.stderr == c.stderr, (w, c)
    assert warm.run(IS_WARM, "python").stdout.strip() == ZYGOTE_MARK  # it did run warm
    assert cold.run(IS_WARM, "python").stdout.strip() == "main.py"


def test_judging_and_function_calls_run_warm(pools):
    warm, cold = pools
    tests = [{"stdin": f"{i} {i}\n", "expected_stdout": f"{2 * i}\n"} for i in range(5)]
    for pool in pools:
        j = pool.judge("a, b = map(int, input().split())\nprint(a + b)", "python", tests)
        assert j.verdict == "AC" and j.passed == 5
        f = pool.judge("def add(a, b):\n    return a + b", "python", [{"args": [2, 3], "expected_return": 5}],
                       fn_name="add")
        assert f.verdict == "AC", f


def test_consecutive_warm_runs_do_not_see_each_other(pools):
    warm = pools[0]
    plant = ("import os, sys, builtins, subprocess\n"
             "open('/tmp/planted', 'w').write('x'); open('/work/planted', 'w').write('x')\n"
             "sys.modules['json'] = 'poisoned'; builtins.print = None; sys.path.insert(0, '/tmp')\n"
             "open('/tmp/json.py', 'w').write('POISON = 1')\n"
             "os.environ['POISON'] = '1'; os.chdir('/tmp')\n"
             "subprocess.Popen(['/usr/bin/sleep', '60'], start_new_session=True)\n"
             "import ctypes; ctypes.CDLL(None).setenv(b'POISON2', b'1', 1)\n")
    probe = ("import os, sys, json\n"
             "print(os.path.exists('/tmp/planted'), os.path.exists('/work/planted'), os.listdir('/tmp'),"
             " 'POISON' in os.environ, 'POISON2' in os.environ, os.getcwd(), hasattr(json, 'POISON'),"
             " sys.path[0], [p for p in os.listdir('/proc') if p.isdigit()])")
    for _ in range(4):  # both workers, twice
        assert warm.run(plant, "python").verdict == "OK"
    time.sleep(0.05)
    assert warm_leftovers(warm) == []
    for _ in range(4):
        r = warm.run(probe, "python")
        assert r.verdict == "OK", r
        assert r.stdout.strip() == "False False [] False False /work False /usr/lib/python311.zip ['1', '2']", r


def test_a_listener_one_run_leaves_is_gone_for_the_next(pools):
    """Each warm run gets a fresh network namespace (docs/sandbox.md, warm Python runs): a listener one run leaves
    (on the loopback, on an abstract unix socket, in a background process) is gone for the next."""
    warm = pools[0]
    listen = ("import os, socket, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    for family, address in ((socket.AF_INET, ('127.0.0.1', 45871)), (socket.AF_UNIX, '\\0credo')):\n"
              "        try:\n"
              "            s = socket.socket(family, socket.SOCK_STREAM); s.bind(address); s.listen()\n"
              "        except OSError:\n"
              "            pass\n"
              "    time.sleep(60)\n"
              "time.sleep(0.2)\nprint('planted')\n")
    probe = ("import socket\n"
             "for family, address in ((socket.AF_INET, ('127.0.0.1', 45871)), (socket.AF_UNIX, '\\0credo')):\n"
             "    try:\n"
             "        socket.socket(family, socket.SOCK_STREAM).connect(address); print('reached')\n"
             "    except OSError as exc:\n"
             "        print(type(exc).__name__)\n")
    for _ in range(4):  # both workers, twice
        assert warm.run(listen, "python", limits=Limits(time_s=1.0)).stdout == "planted\n"
    for _ in range(4):
        r = warm.run(probe, "python")
        assert r.verdict == "OK" and "reached" not in r.stdout and r.stdout.count("\n") == 2, r


def test_a_run_cannot_reach_its_zygote(pools):
    warm = pools[0]
    r = warm.run("import os\nprint(sorted(os.listdir('/proc')) == sorted(set(os.listdir('/proc'))))\n"
                 "for pid in range(1, 64):\n"
                 "    try:\n        os.kill(pid, 9) if pid > 2 else None\n    except OSError:\n        pass\n"
                 "print(open('/proc/1/cmdline').read()[:8] if os.access('/proc/1/mem', os.R_OK) else 'no mem')",
                 "python", limits=Limits(time_s=1.0))
    assert r.verdict == "OK" and r.stdout.splitlines()[-1] == "no mem", r
    assert warm.run("print(2)", "python").stdout == "2\n"


def test_warm_runs_recover_from_a_dead_zygote(pools):
    warm = pools[0]
    assert warm.run("print(1)", "python").verdict == "OK"
    for pid in zygotes(warm):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    results = [warm.run("print(3)", "python") for _ in range(4)]
    assert [r.verdict for r in results] == ["OK"] * 4, results
    assert warm.run(IS_WARM, "python").stdout.strip() == ZYGOTE_MARK
    assert len(zygotes(warm)) == 2


@pytest.mark.parametrize("prog", [p for p in PROGRAMS if p.language == "python"], ids=lambda p: p.name)
def test_hostile_python_program_runs_warm(pools, host, prog):  # noqa: F811 - host is the fixture
    warm = pools[0]
    result = warm.submit(_request(prog, host)).result()
    stdout = result.stdout if hasattr(result, "stdout") else "".join(t.stdout_head for t in result.tests)
    detail = (result.detail, getattr(result, "stderr", "")[-300:], stdout[:300])
    assert result.verdict in prog.verdicts, detail
    if prog.stdout_has:
        assert prog.stdout_has in stdout and "ALLOWED" not in stdout and "connected" not in stdout, detail
    assert host["secret"] not in stdout
    time.sleep(0.05)
    assert warm_leftovers(warm) == [], f"{prog.name} left processes behind"
    if not ROOTLESS:
        assert uid_processes(zygote_chain(warm)) == [], f"{prog.name} left processes of a sandbox uid behind"
    assert host["server"].hits == [], f"{prog.name} reached the host loopback"
    assert host["bystander"].poll() is None, f"{prog.name} killed a host process"
    for c, digest in host["digests"].items():
        assert c.exists() and _digest(c) == digest, f"{prog.name} touched a canary"
    assert len(zygotes(warm)) <= 2


def test_runs_that_are_not_plain_python_take_the_cold_path(pools):
    warm = pools[0]
    r = warm.submit(RunRequest(source=IS_WARM, language="python", fetch_files=["main.py"])).result()
    assert r.stdout.strip() == "main.py" and "main.py" in r.files
    r = warm.run(IS_WARM, "python", limits=Limits(extra_env={"X": "1"}))
    assert r.stdout.strip() == "main.py"
