"""Evidence for the code sandbox (docs/sandbox.md "Evidence"): credo's judge against a reference executor (a bare
subprocess with a wall-clock timeout, no isolation) on programs of known verdict, over seeds, in credo compare's
JSON shape (``credo.report.stats.write_compare_json``; baseline ``reference``).

    python benchmarks/evidence_sandbox.py --seeds 0,1,2,3,4 --json docs/evidence/data/sandbox_verdicts.json

Two problems (the sum of two integers, the maximum of a list), each in Python and C++, each as six programs: a
correct one, a correct one that prints extra whitespace, an off-by-one (wrong answer), a subtle bug that only some
inputs expose (``abs(a) + b``; the maximum started at 0), a crash (runtime error), a busy loop (time limit) and a
syntax error (compile error). A seed draws the tests (5 per problem, integers from -50 to 50). Both executors judge
every program on the same tests, stop at the first failing test, and compare outputs by whitespace-separated
tokens (the sandbox's ``tokens`` checker). Per seed and executor: the share of programs whose verdict is the
intended one, the true-positive rate (correct programs accepted: MPLSandbox's and Klear's reward 1) and the
true-negative rate (faulty programs rejected: Klear-CodeTest's TNR); the share of programs on which the two
executors agree is recorded beside them.
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = {
    "sum": {"AC": "a, b = map(int, input().split())\nprint(a + b)\n",
            "AC_ws": "a, b = map(int, input().split())\nprint(' ', a + b, '  ')\nprint()\n",
            "WA": "a, b = map(int, input().split())\nprint(a + b + 1)\n",
            "WA_subtle": "a, b = map(int, input().split())\nprint(abs(a) + b)\n",
            "RE": "a, b = map(int, input().split())\nraise ValueError(a)\n",
            "TLE": "while True:\n    pass\n",
            "CE": "a, b = map(int, input().split()\nprint(a + b)\n"},
    "max": {"AC": "input()\nprint(max(map(int, input().split())))\n",
            "AC_ws": "input()\nxs = list(map(int, input().split()))\nprint(max(xs), end='  \\n\\n')\n",
            "WA": "input()\nprint(max(map(int, input().split())) - 1)\n",
            "WA_subtle": "input()\nbest = 0\nfor x in map(int, input().split()):\n    best = max(best, x)\nprint(best)\n",
            "RE": "input()\nxs = list(map(int, input().split()))\nprint(xs[len(xs)])\n",
            "TLE": "input()\nwhile True:\n    pass\n",
            "CE": "input(\nprint(0)\n"},
}
CPP_HEAD = "#include <iostream>\nint main(){"
CPP = {
    "sum": {"AC": CPP_HEAD + "long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n",
            "AC_ws": CPP_HEAD + "long a,b;std::cin>>a>>b;std::cout<<\"  \"<<a+b<<\" \\n\\n\";}\n",
            "WA": CPP_HEAD + "long a,b;std::cin>>a>>b;std::cout<<a+b+1<<std::endl;}\n",
            "WA_subtle": CPP_HEAD + "long a,b;std::cin>>a>>b;std::cout<<(a<0?-a:a)+b<<std::endl;}\n",
            "RE": CPP_HEAD + "long a,b;std::cin>>a>>b;return 3;}\n",
            "TLE": CPP_HEAD + "volatile long x=0;while(true){x++;}}\n",
            "CE": CPP_HEAD + "long a,b std::cin>>a>>b;}\n"},
    "max": {"AC": CPP_HEAD + "int n;long x,m;std::cin>>n>>m;for(int i=1;i<n;i++){std::cin>>x;if(x>m)m=x;}"
                             "std::cout<<m<<std::endl;}\n",
            "AC_ws": CPP_HEAD + "int n;long x,m;std::cin>>n>>m;for(int i=1;i<n;i++){std::cin>>x;if(x>m)m=x;}"
                                "std::cout<<m<<\"   \\n\";}\n",
            "WA": CPP_HEAD + "int n;long x,m;std::cin>>n>>m;for(int i=1;i<n;i++){std::cin>>x;if(x>m)m=x;}"
                             "std::cout<<m-1<<std::endl;}\n",
            "WA_subtle": CPP_HEAD + "int n;long x,m=0;std::cin>>n;for(int i=0;i<n;i++){std::cin>>x;if(x>m)m=x;}"
                                    "std::cout<<m<<std::endl;}\n",
            "RE": CPP_HEAD + "int n;std::cin>>n;return 1;}\n",
            "TLE": CPP_HEAD + "volatile long x=0;while(true){x++;}}\n",
            "CE": CPP_HEAD + "int n std::cin>>n;}\n"},
}
SOURCES = {"python": PY, "cpp": CPP}
TIME_S = 0.5


def intended(variant: str) -> str:
    return variant.split("_")[0]  # AC_ws -> AC, WA_subtle -> WA


def draw_tests(problem: str, rng: random.Random, k: int = 5) -> list[dict[str, str]]:
    tests = []
    for _ in range(k):
        if problem == "sum":
            a, b = rng.randint(-50, 50), rng.randint(-50, 50)
            tests.append({"stdin": f"{a} {b}\n", "expected_stdout": f"{a + b}\n"})
        else:
            xs = [rng.randint(-50, 50) for _ in range(rng.randint(1, 6))]
            tests.append({"stdin": f"{len(xs)}\n{' '.join(map(str, xs))}\n", "expected_stdout": f"{max(xs)}\n"})
    return tests


class Reference:
    """The reference executor: a bare subprocess per test (``python3 prog.py`` / a ``g++ -O2`` binary), a
    wall-clock timeout of ``time_s``, no isolation and no limits; compile once per source."""

    def __init__(self, root: Path, time_s: float = TIME_S):
        self.root, self.time_s, self.cache = root, time_s, {}

    def build(self, source: str, language: str) -> list[str] | None:
        """The command that runs ``source`` (None: it does not compile)."""
        key = (source, language)
        if key not in self.cache:
            d = self.root / f"p{len(self.cache)}"
            d.mkdir()
            if language == "python":
                (d / "prog.py").write_text(source)
                ok = subprocess.run(["/usr/bin/python3", "-m", "py_compile", str(d / "prog.py")],
                                    capture_output=True).returncode == 0
                self.cache[key] = ["/usr/bin/python3", str(d / "prog.py")] if ok else None
            else:
                (d / "prog.cpp").write_text(source)
                ok = subprocess.run(["g++", "-O2", "-o", str(d / "a.out"), str(d / "prog.cpp")],
                                    capture_output=True).returncode == 0
                self.cache[key] = [str(d / "a.out")] if ok else None
        return self.cache[key]

    def judge(self, source: str, language: str, tests: list[dict[str, str]]) -> str:
        cmd = self.build(source, language)
        if cmd is None:
            return "CE"
        for t in tests:
            try:
                p = subprocess.run(cmd, input=t["stdin"], capture_output=True, text=True, timeout=self.time_s)
            except subprocess.TimeoutExpired:
                return "TLE"
            if p.returncode != 0:
                return "RE"
            if p.stdout.split() != t["expected_stdout"].split():
                return "WA"
        return "AC"


def programs() -> list[tuple[str, str, str, str]]:
    """(language, problem, variant, source) of every program."""
    return [(lang, prob, var, src) for lang, by_prob in SOURCES.items() for prob, by_var in by_prob.items()
            for var, src in by_var.items()]


def scores(verdicts: list[str], labels: list[str]) -> dict[str, float]:
    """Verdict accuracy, TPR (intended AC judged AC) and TNR (intended faulty judged not AC)."""
    pos = [v for v, lab in zip(verdicts, labels) if lab == "AC"]
    neg = [v for v, lab in zip(verdicts, labels) if lab != "AC"]
    return {"verdict_acc": sum(v == lab for v, lab in zip(verdicts, labels)) / len(labels),
            "tpr": sum(v == "AC" for v in pos) / len(pos), "tnr": sum(v != "AC" for v in neg) / len(neg)}


def run_seed(seed: int, sandbox, reference: Reference) -> dict:
    from credo.sandbox import JudgeRequest, Limits

    rng = random.Random(seed)
    tests = {prob: draw_tests(prob, rng) for prob in PY}
    progs = programs()
    labels = [intended(var) for _, _, var, _ in progs]
    reqs = [JudgeRequest(source=src, tests=tests[prob], language=lang, limits=Limits(time_s=TIME_S),
                         checker="tokens", stop_on_first_failure=True) for lang, prob, _, src in progs]
    t0 = time.perf_counter()
    sb = [r.verdict for r in sandbox.judge_batch(reqs)]
    t1 = time.perf_counter()
    ref = [reference.judge(src, lang, tests[prob]) for lang, prob, _, src in progs]
    t2 = time.perf_counter()
    return {"sandbox": scores(sb, labels), "reference": scores(ref, labels),
            "agreement": sum(a == b for a, b in zip(sb, ref)) / len(progs),
            "verdicts": {f"{lang}/{prob}/{var}": [a, b] for (lang, prob, var, _), a, b in zip(progs, sb, ref)},
            "wall_s": {"sandbox": round(t1 - t0, 2), "reference": round(t2 - t1, 2)}}


def main(argv: list[str] | None = None) -> None:
    from credo.report.stats import metric_block, write_compare_json
    from credo.sandbox import Sandbox

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--json", default="docs/evidence/data/sandbox_verdicts.json")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed = []
    with Sandbox(workers=1) as sandbox, tempfile.TemporaryDirectory() as tmp:
        reference = Reference(Path(tmp))
        for seed in seeds:
            per_seed.append(run_seed(seed, sandbox, reference))
            print(f"seed {seed}: sandbox {per_seed[-1]['sandbox']} reference {per_seed[-1]['reference']} "
                  f"agreement {per_seed[-1]['agreement']:.3f} wall {per_seed[-1]['wall_s']}", flush=True)
    metrics = {f"{k}@mean": metric_block({arm: [s[arm][k] for s in per_seed] for arm in ("reference", "sandbox")},
                                         "reference") for k in ("verdict_acc", "tpr", "tnr")}
    command = "python benchmarks/evidence_sandbox.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_compare_json(args.json, name="sandbox_verdicts", command=command, baseline="reference", seeds=seeds,
                       metrics=metrics, extra={"agreement": [s["agreement"] for s in per_seed],
                                               "programs": len(programs()), "time_s": TIME_S,
                                               "verdicts": [s["verdicts"] for s in per_seed],
                                               "wall_s": [s["wall_s"] for s in per_seed]})
    print("wrote", args.json)


if __name__ == "__main__":
    main()
