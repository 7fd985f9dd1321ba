"""Sandbox: correct verdicts for normal programs in every language, checkers, function-call mode, batching."""
from __future__ import annotations

import pytest

from credo.sandbox import Limits, detect_language, extract_code
from credo.sandbox.checkers import check_output, parse_return, returns_equal
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

FAST = Limits(time_s=1.0, memory_mb=128)

ADD = {
    "python": "a, b = map(int, input().split())\nprint(a + b)",
    "c": '#include <stdio.h>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);return 0;}',
    "cpp": "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}",
    "javascript": "const [a,b]=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(Number);console.log(a+b);",
    "bash": "read a b\necho $((a + b))",
    "java": "import java.util.*;\npublic class Main{public static void main(String[] x){Scanner s=new Scanner(System.in);"
            "System.out.println(s.nextLong()+s.nextLong());}}",
}
TESTS = [{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "40 2\n", "expected_stdout": "42"},
         {"stdin": "-5 5\n", "expected_stdout": "0\n"}, {"stdin": "100 23\n", "expected_stdout": "123\n"},
         {"stdin": "7 8\n", "expected_stdout": "15\n"}]

# per language: wrong answer, compile error (or syntax error), runtime error, infinite loop, memory hog, output flood
BROKEN = {
    "python": {"WA": "print(0)", "CE": "def f(:\n  pass", "RE": "raise ValueError('boom')",
               "TLE": "while True: pass", "MLE": "x = bytearray(1 << 30)", "OLE": "while True: print('y' * 4096)"},
    "c": {"WA": "int main(){puts(\"0\");}", "CE": "int main(){ return x; }", "RE": "int main(){int*p=0;*p=1;}",
          "TLE": "int main(){volatile long i=0;for(;;)i++;}",
          "MLE": "#include <stdlib.h>\n#include <stdio.h>\nint main(){size_t n=1<<30;volatile char*p=malloc(n);"
                 "for(size_t i=0;i<n;i+=4096)p[i]=(char)i;printf(\"%d\",p[4096]);}",
          "OLE": "#include <stdio.h>\nint main(){for(;;)puts(\"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\");}"},
    "cpp": {"WA": "#include <iostream>\nint main(){std::cout<<0;}", "CE": "int main(){ std::vector<int> v; }",
            "RE": "#include <stdexcept>\nint main(){throw std::runtime_error(\"x\");}",
            "TLE": "int main(){volatile long i=0;while(true)i++;}",
            "MLE": "#include <vector>\nint main(){std::vector<char> v(1<<30, 1); return v[5];}",
            "OLE": "#include <cstdio>\nint main(){while(1)std::puts(\"yyyyyyyyyyyyyyyyyyyyyyyy\");}"},
    "javascript": {"WA": "console.log(0)", "CE": "function (", "RE": "throw new Error('x')",
                   "TLE": "while(true){}", "MLE": "let a=[];while(true)a.push(new Array(1e6).fill(1));",
                   "OLE": "const fs=require('fs');while(true)fs.writeSync(1,'y'.repeat(4096)+'\\n')"},
    "bash": {"WA": "echo 0", "CE": "if then fi (", "RE": "exit 3", "TLE": "while true; do :; done",
             "MLE": "x=$(head -c 400000000 /dev/zero | tr '\\0' a)\necho ${#x}", "OLE": "yes yyyyyyyyyyyyyyyyyyy"},
    "java": {"WA": "public class Main{public static void main(String[] a){System.out.println(0);}}",
             "CE": "public class Main{public static void main(String[] a){int x = ;}}",
             "RE": "public class Main{public static void main(String[] a){throw new RuntimeException(\"x\");}}"},
}


@pytest.mark.parametrize("language", sorted(ADD))
def test_accepted_in_every_language(sandbox, language):
    limits = Limits(time_s=5.0, memory_mb=256) if language == "java" else FAST
    j = sandbox.judge(ADD[language], language, TESTS, limits=limits)
    assert j.verdict == "AC", (j.detail, j.compile_output, [t.__dict__ for t in j.tests if t.verdict != "AC"])
    assert j.passed == j.total == 5 and j.language == language


@pytest.mark.parametrize("language,verdict", [(lang, v) for lang, cases in BROKEN.items() for v in cases])
def test_each_failure_verdict(sandbox, language, verdict):
    limits = Limits(time_s=5.0, memory_mb=256) if language == "java" else FAST
    if (language, verdict) == ("bash", "MLE"):
        limits = Limits(time_s=10.0, memory_mb=128)  # building a 400 MB string in bash takes seconds of CPU
    j = sandbox.judge(BROKEN[language][verdict], language, TESTS[:2], limits=limits, stop_on_first_failure=True)
    expected = verdict  # a syntax error of an interpreted language is a compile error too
    assert j.verdict == expected, (j.detail, j.compile_output[:300], [(t.verdict, t.detail, t.stderr_head[:200])
                                                                        for t in j.tests])
    assert j.passed == 0


def test_run_reports_outputs_and_measurements(sandbox):
    r = sandbox.run("import sys\nprint(input()[::-1])\nprint('err', file=sys.stderr)\nsys.exit(0)", "python",
                    stdin="hello\n", limits=FAST)
    assert r.verdict == "OK" and r.stdout == "olleh\n" and r.stderr == "err\n" and r.exit_code == 0
    assert 0 < r.cpu_time_s < 1.0 and 0 < r.wall_time_s < 5.0 and r.memory_peak_bytes > 0
    r = sandbox.run("import os; os.kill(os.getpid(), 11)", "python", limits=FAST)
    assert r.verdict == "RE" and r.signal == 11 and "SIGSEGV" in r.detail
    r = sandbox.run("import sys; sys.exit(7)", "python", limits=FAST)
    assert r.verdict == "RE" and r.exit_code == 7


def test_time_limit_is_cpu_time_with_a_wall_backstop(sandbox):
    busy = sandbox.run("while True: pass", "python", limits=Limits(time_s=0.5))
    assert busy.verdict == "TLE" and "CPU" in busy.detail and busy.cpu_time_s >= 0.5
    asleep = sandbox.run("import time; time.sleep(60)", "python", limits=Limits(time_s=0.5, wall_factor=2.0))
    assert asleep.verdict == "TLE" and "wall" in asleep.detail and asleep.wall_time_s < 5


def test_compile_errors_are_reported_and_cached(sandbox):
    bad = "int main() { return undefined_symbol; }"
    first = sandbox.judge(bad, "c", TESTS[:1], limits=FAST)
    second = sandbox.judge(bad, "c", TESTS[:1], limits=FAST)
    assert first.verdict == second.verdict == "CE" and "undefined_symbol" in first.compile_output


def test_checkers():
    assert check_output("exact", "3\n", "3\n")[0] and not check_output("exact", "3", "3\n")[0]
    assert check_output("tokens", " 1  2\n3 ", "1 2 3")[0] and not check_output("tokens", "1 2", "1 2 3")[0]
    assert check_output("lines", "\n  a b \nc\n\n", "a b\nc")[0] and not check_output("lines", "a\nb", "a b")[0]
    assert check_output("float", "0.3333334 x", "0.333333 x", float_tol=1e-5)[0]
    assert not check_output("float", "0.34", "0.33", float_tol=1e-3)[0]
    assert not check_output("float", "nan", "1.0")[0]
    with pytest.raises(ValueError):
        check_output("fuzzy", "a", "a")


def test_judge_with_float_and_program_checkers(sandbox):
    src = "print(1/3)"
    assert sandbox.judge(src, "python", [{"expected_stdout": "0.3333333"}], checker="float", limits=FAST).verdict == "AC"
    assert sandbox.judge(src, "python", [{"expected_stdout": "0.33"}], checker="float", limits=FAST).verdict == "WA"
    # any permutation of the expected numbers is accepted by this checker
    checker = ("a = sorted(open('output.txt').read().split()); b = sorted(open('expected.txt').read().split())\n"
               "print('True' if a == b else 'False')")
    j = sandbox.judge("print(3, 1, 2)", "python", [{"stdin": "", "expected_stdout": "1 2 3"}], checker="program",
                      checker_source=checker, limits=FAST)
    assert j.verdict == "AC", j.tests[0].detail
    j = sandbox.judge("print(3, 1, 4)", "python", [{"stdin": "", "expected_stdout": "1 2 3"}], checker="program",
                      checker_source=checker, limits=FAST)
    assert j.verdict == "WA"


def test_function_call_mode(sandbox):
    tests = [{"args": [2, 3], "expected_return": 5}, {"args": [[1], [2]], "expected_return": [1, 2]},
             {"args": ["a", "b"], "expected_return": "ab"}]
    assert sandbox.judge("def add(a, b):\n    return a + b", "python", tests, fn_name="add", limits=FAST).verdict == "AC"
    leet = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert sandbox.judge(leet, "python", tests, fn_name="add", limits=FAST).verdict == "AC"
    j = sandbox.judge("def add(a, b):\n    return a - b", "python", tests, fn_name="add", limits=FAST)
    assert j.verdict == "WA" and j.passed == 0 and "expected 5" in j.tests[0].detail
    # an exit status is never a pass: exiting 0 before returning is a wrong answer
    j = sandbox.judge("import sys\ndef add(a, b):\n    sys.exit(0)", "python", tests[:1], fn_name="add", limits=FAST)
    assert j.verdict == "WA" and "no return value" in j.tests[0].detail
    assert sandbox.judge("def other(): pass", "python", tests[:1], fn_name="add", limits=FAST).verdict == "RE"


def test_parse_return_takes_the_last_sentinel_line():
    out = "noise\n@@s@@1\nmore\n@@s@@[2, 3]\n"
    assert parse_return(out, "@@s@@") == (True, [2, 3])
    assert parse_return("no marker", "@@s@@") == (False, None)
    assert returns_equal([1, 2.0000001], (1, 2)) and not returns_equal(True, 1) and not returns_equal("1", 1)


def test_judge_batch_runs_in_parallel_and_keeps_order(sandbox):
    reqs = [{"source": ADD["python"] if i % 2 == 0 else BROKEN["python"]["WA"], "language": "python",
             "tests": TESTS[:2], "limits": {"time_s": 1.0}} for i in range(6)]
    out = sandbox.judge_batch(reqs)
    assert [r.verdict for r in out] == ["AC", "WA"] * 3


@pytest.mark.parametrize("text,language", [
    ("```cpp\nint main(){}\n```", "cpp"), ("```python\nprint(1)\n```", "python"),
    ("#include <stdio.h>\nint main(){printf(\"x\");}", "c"), ("#include <iostream>\nint main(){std::cout<<1;}", "cpp"),
    ("console.log(1)", "javascript"), ("public class Main { public static void main(String[] a){} }", "java"),
    ("read x\necho $x", "bash"), ("def f():\n    return 1\nprint(f())", "python"),
    ("Here is my answer:\n```js\nconsole.log(2)\n```\nDone.", "javascript"),
])
def test_language_detection(text, language):
    assert detect_language(text) == language


def test_fenced_code_is_extracted_before_running(sandbox):
    code, tag = extract_code("Sure!\n```python\nprint(6 * 7)\n```\nHope it helps.")
    assert code == "print(6 * 7)\n" and tag == "python"
    r = sandbox.run("Sure!\n```python\nprint(6 * 7)\n```\nHope it helps.", limits=FAST)
    assert r.verdict == "OK" and r.stdout == "42\n" and r.language == "python"


def test_unknown_language_is_an_infrastructure_verdict_not_a_crash(sandbox):
    assert sandbox.run("print(1)", "cobol", limits=FAST).verdict == "SE"


def test_missing_isolation_is_a_clear_error(monkeypatch):
    import credo.sandbox.preflight as preflight
    from credo.sandbox import Sandbox, SandboxUnavailable

    monkeypatch.setattr(preflight, "find_bwrap", lambda: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(workers=1)


def test_unsafe_mode_runs_with_a_warning(caplog):
    from credo.sandbox import Sandbox

    with Sandbox(workers=1, unsafe=True) as sb:
        r = sb.run("print(6 * 7)", "python", limits=FAST)
        t = sb.run("while True: pass", "python", limits=Limits(time_s=0.5))
    assert r.verdict == "OK" and r.stdout == "42\n" and t.verdict == "TLE"
    assert "UNSAFE" in caplog.text


def test_a_stuck_worker_is_killed_restarted_and_reported_as_se(sandbox, monkeypatch):
    import credo.sandbox.pool as pool

    monkeypatch.setattr(pool, "job_timeout", lambda request: 0.5)  # the parent gives up on the worker
    before = sandbox.stats["worker_restarts"]
    r = sandbox.run("import time; time.sleep(5)", "python", limits=Limits(time_s=5.0))
    assert r.verdict == "SE" and "timed out" in r.detail
    monkeypatch.undo()
    assert sandbox.run("print(1)", "python", limits=FAST).verdict == "OK"  # a fresh worker took over
    assert sandbox.stats["worker_restarts"] > before
