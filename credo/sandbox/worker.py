"""What a sandbox worker process does: compile (cached by hash) and run submissions, judge tests.

Each worker is a long-lived process, marked a child subreaper so orphans of a run are reaped by the worker,
never by the host's init. In root mode every run drops to the worker's own unprivileged uid
(``uid_base + index``) inside a per-run cgroup; in rootless mode (:mod:`credo.sandbox.isolation`) runs keep
the worker's uid and are bounded by rlimits and the process-tree watchdog instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import uuid
from dataclasses import replace
from pathlib import Path

from credo.sandbox.cgroups import CgroupManager
from credo.sandbox.checkers import (
    PYTHON_HARNESS,
    check_output,
    checker_verdict,
    harness_payload,
    parse_return,
    returns_equal,
)
from credo.sandbox import executor, workfiles
from credo.sandbox.executor import Identity, RawRun, execute
from credo.sandbox.isolation import reachable_bwrap, resolve_mode
from credo.sandbox.languages import Language, detect_language, extract_code, get_language
from credo.sandbox.limits import (
    AC,
    CE,
    COMPILE_LIMITS,
    MLE,
    OK,
    OLE,
    RE,
    SE,
    SEVERITY,
    TLE,
    WA,
    Limits,
    compile_limits,
)
from credo.sandbox.zygote import Zygote, warm_default
from credo.sandbox.results import HEAD_BYTES, JudgeRequest, JudgeResult, RunRequest, RunResult, TestResult

PR_SET_CHILD_SUBREAPER = 36
MAX_CACHE_ENTRIES = 4096  # compiled programs kept; the oldest are evicted beyond this
_MEMORY_ERRORS = ("MemoryError", "OutOfMemoryError", "std::bad_alloc", "out of memory",
                  "JavaScript heap out of memory", "Cannot allocate memory")


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class WorkerContext:
    def __init__(self, index: int, *, root: Path, uid_base: int, isolated: bool):
        self.index = index
        self.isolated = isolated
        # the pool passes its mode in $CREDO_SANDBOX_MODE; unsafe mode keeps the old best effort (uid drop as root)
        self.mode = resolve_mode() if isolated else "unsafe"
        rooted = self.mode == "root" or (self.mode == "unsafe" and os.geteuid() == 0)
        self.identity = Identity(uid_base + index, uid_base + index) if rooted else None
        self.cgroups = CgroupManager() if self.mode == "root" else (None if isolated else _optional_cgroups())
        self.root = Path(root)
        self.jobs = self.root / f"w{index}"
        self.cache = self.root / "cache"
        for d in (self.jobs, self.cache):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o755)
        # a uid-dropped run must be able to reach the bwrap binary (root mode: a copy under the pool's root)
        self.bwrap = reachable_bwrap(executor.BWRAP, self.root / "bin" / f"w{index}") if self.mode == "root" else ""
        # warm Python runs (credo.sandbox.zygote): Sandbox(warm=True) sets $CREDO_SANDBOX_WARM; never in unsafe mode
        self.zygote = (Zygote(identity=self.identity, cgroups=self.cgroups, rootless=self.mode == "rootless",
                              bwrap=self.bwrap) if isolated and warm_default() else None)

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()

    # ------------------------------------------------------------------------------ public
    def run(self, req: RunRequest) -> RunResult:
        job = self._new_job()
        try:
            lang, source = self._language(req.source, req.language)
            prepared = self._prepare(job, lang, source, req.inputs, compile_limits(req.compile_timeout_s))
            if isinstance(prepared, RunResult):
                return replace(prepared, language=lang.name)
            files, step = prepared
            raw = self._exec(lang, lang.run, files, req.stdin.encode(), req.limits, job, inputs=req.inputs,
                             fetch=tuple(req.fetch_files))
            result = syntax_as_compile_error(lang, to_run_result(raw, req.limits))
            return replace(result, language=lang.name, files=workfiles.encode(raw.files), compile=step)
        except ValueError as exc:
            return RunResult(verdict=SE, detail=str(exc))
        finally:
            shutil.rmtree(job, ignore_errors=True)

    def judge(self, req: JudgeRequest) -> JudgeResult:
        job = self._new_job()
        try:
            lang, source = self._language(req.source, req.language)
            if req.fn_name and lang.name != "python":
                raise NotImplementedError(f"function-call mode supports python only, not {lang.name}")
            prepared = self._prepare(job, lang, source, build_limits=compile_limits(req.compile_timeout_s))
            if isinstance(prepared, RunResult):
                verdict = CE if prepared.verdict == CE else SE
                return JudgeResult(verdict=verdict, total=len(req.tests), language=lang.name,
                                   compile_output=prepared.stderr, detail=prepared.detail)
            return self._judge_tests(req, lang, prepared[0], job)
        except (ValueError, NotImplementedError) as exc:
            return JudgeResult(verdict=SE, total=len(req.tests), detail=str(exc))
        finally:
            shutil.rmtree(job, ignore_errors=True)

    # ------------------------------------------------------------------------------ judging
    def _judge_tests(self, req: JudgeRequest, lang: Language, files: dict[str, Path], job: Path) -> JudgeResult:
        results: list[TestResult] = []
        if req.fn_name:
            harness = job / "harness.py"
            harness.write_text(PYTHON_HARNESS)
            os.chmod(harness, 0o644)
            files = {**files, "harness.py": harness}
        for i, test in enumerate(req.tests):
            results.append(self._one_test(req, lang, files, job, i, test))
            if req.stop_on_first_failure and results[-1].verdict != AC:
                break
        passed = sum(r.verdict == AC for r in results)
        failing = [r for r in results if r.verdict != AC]
        verdict = AC if passed == len(req.tests) else (failing[0].verdict if failing else WA)
        if any(r.verdict == SE for r in results):
            verdict = SE  # an infrastructure failure is never scored as a wrong answer
        return JudgeResult(verdict=verdict, passed=passed, total=len(req.tests), tests=results, language=lang.name)

    def _one_test(self, req: JudgeRequest, lang: Language, files, job: Path, i: int, test: dict) -> TestResult:
        if req.fn_name:
            sentinel = "@@credo-" + secrets.token_hex(16) + "@@"
            stdin = harness_payload(sentinel, req.fn_name, list(test.get("args", [])))
            argv = ("/usr/bin/python3", "-I", "-S", "-B", "harness.py")
            raw = self._exec(lang, argv, files, stdin.encode(), req.limits, job)
        else:
            raw = self._exec(lang, lang.run, files, str(test.get("stdin", "")).encode(), req.limits, job)
        run = syntax_as_compile_error(lang, to_run_result(raw, req.limits))
        base = TestResult(index=i, verdict=run.verdict, cpu_time_s=run.cpu_time_s, wall_time_s=run.wall_time_s,
                          memory_peak_bytes=run.memory_peak_bytes, stdout_head=run.stdout[:HEAD_BYTES],
                          stderr_head=run.stderr[:HEAD_BYTES], detail=run.detail)
        if run.verdict != OK:
            return base
        if req.fn_name:
            found, value = parse_return(run.stdout, sentinel)
            if not found:
                return replace(base, verdict=WA, detail="no return value reported by the harness")
            ok = returns_equal(value, test.get("expected_return"), req.float_tol)
            return replace(base, verdict=AC if ok else WA,
                           detail="" if ok else f"expected {test.get('expected_return')!r}, got {value!r}")
        expected = str(test.get("expected_stdout", ""))
        if req.checker == "program":
            ok, detail = self._checker_program(req, test, run.stdout, expected, job)
        else:
            ok, detail = check_output(req.checker, run.stdout, expected, float_tol=req.float_tol)
        if ok is None:
            return replace(base, verdict=SE, detail=detail)
        return replace(base, verdict=AC if ok else WA, detail=detail)

    def _checker_program(self, req: JudgeRequest, test: dict, output: str, expected: str, job: Path):
        """Run the user's checker in the sandbox: it reads input.txt, output.txt, expected.txt and prints True/False."""
        if not req.checker_source:
            return None, "checker='program' needs checker_source"
        lang = get_language(req.checker_language)
        cjob = job / f"checker-{uuid.uuid4().hex[:8]}"
        cjob.mkdir()
        os.chmod(cjob, 0o755)
        prepared = self._prepare(cjob, lang, req.checker_source, build_limits=compile_limits(req.compile_timeout_s))
        if isinstance(prepared, RunResult):
            return None, f"checker did not compile: {prepared.stderr[:300]}"
        files = dict(prepared[0])
        for name, text in (("input.txt", str(test.get("stdin", ""))), ("output.txt", output),
                           ("expected.txt", expected)):
            path = cjob / name
            path.write_text(text)
            os.chmod(path, 0o644)
            files[name] = path
        raw = self._exec(lang, lang.run, files, b"", replace(req.limits, time_s=max(req.limits.time_s, 5.0)), cjob)
        run = to_run_result(raw, req.limits)
        if run.verdict != OK:
            return None, f"checker failed: {run.verdict} {run.stderr[:300]}"
        return checker_verdict(run.stdout), "" if checker_verdict(run.stdout) else f"checker: {run.stdout[:200]}"

    # ------------------------------------------------------------------------------ compile and run
    def _language(self, source: str, language: str | None) -> tuple[Language, str]:
        code, tag = extract_code(source)
        name = language or detect_language(source)
        return get_language(name), code

    def _new_job(self) -> Path:
        job = self.jobs / uuid.uuid4().hex
        job.mkdir()
        os.chmod(job, 0o755)
        return job

    def _prepare(self, job: Path, lang: Language, source: str, inputs: dict[str, bytes] | None = None,
                 build_limits: Limits = COMPILE_LIMITS) -> tuple[dict[str, Path], RunResult | None] | RunResult:
        """Files to bind into /work (the source, or the cached build artifacts) and the compile step (None
        for interpreted languages); a RunResult (CE or SE) when compilation fails. ``inputs`` are in the
        build directory while compiling. A missing toolchain raises ValueError (an SE, never the program's)."""
        missing = missing_toolchain(lang)
        if missing:
            raise ValueError(missing)
        src = job / lang.source_file
        src.write_text(source)
        os.chmod(src, 0o644)
        if lang.compile is None:
            return {lang.source_file: src}, None
        return self._compiled(job, lang, source, inputs or {}, build_limits)

    def _compiled(self, job: Path, lang: Language, source: str, inputs: dict[str, bytes],
                  limits: Limits) -> tuple[dict[str, Path], RunResult] | RunResult:
        """The cached build of ``source`` (with ``inputs``), built first when not cached, or when the cache
        holds a compile timeout under a smaller limit than ``limits`` (one under a larger limit is final)."""
        digest = sorted((name, hashlib.sha256(data).hexdigest()) for name, data in inputs.items())
        key = hashlib.sha256(json.dumps([lang.name, lang.compile, source, digest]).encode()).hexdigest()
        entry = self.cache / key
        cached = _cached_step(entry)
        if cached is not None and (cached[0].verdict != TLE or limits.time_s <= cached[1]):
            step = cached[0]
        else:
            step = self._build(job, lang, source, entry, inputs, limits)
        if step.verdict == SE:
            return replace(step, compile=step)
        if step.verdict != OK:
            return replace(step, verdict=CE, detail=f"compilation failed ({step.verdict}): {step.detail}",
                           compile=step)
        return {name: entry / name for name in lang.artifacts}, step

    def _build(self, job: Path, lang: Language, source: str, entry: Path, inputs: dict[str, bytes],
               limits: Limits) -> RunResult:
        """Compile inside the sandbox under ``limits``; the compile step's own result (OK, RE, TLE, MLE, OLE or
        SE). Artifacts and result (with the time limit it ran under) are cached under ``entry``, except SE.
        The build directory is the worker's until it is filled (input files 0644), then the run identity's."""
        build = job / "build"
        build.mkdir(mode=0o755)
        owner = (self.identity.uid, self.identity.gid) if self.identity is not None else None
        workfiles.write_host(build, {**inputs, lang.source_file: source.encode()}, owner)
        if owner is not None:
            os.chown(build, *owner)
        raw = execute(list(lang.compile), limits=limits, stdin=b"", identity=self.identity,
                      cgroups=self.cgroups, workdir=build, isolated=self.isolated, env=lang.env,
                      extra_memory_mb=lang.memory_overhead_mb, min_processes=lang.min_processes,
                      rootless=self.mode == "rootless", address_space_mb=lang.address_space_mb, bwrap=self.bwrap)
        result = to_run_result(raw, limits)
        if result.verdict == OK and not all((build / a).is_file() for a in lang.artifacts):
            result = replace(result, verdict=RE, detail="the compiler produced no program")
        if result.verdict == SE:  # infrastructure failures are not cached
            return result
        tmp = self.cache / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        if result.verdict == OK:
            for name in lang.artifacts:
                shutil.copy2(build / name, tmp / name)
                os.chmod(tmp / name, 0o755)
        (tmp / "result.json").write_text(json.dumps({"result": result.__dict__, "time_s": limits.time_s}))
        os.chmod(tmp, 0o755)
        _replace_entry(tmp, entry)
        self._evict()
        return result

    def _evict(self) -> None:
        entries = [p for p in self.cache.iterdir() if not p.name.startswith(".")]
        if len(entries) <= MAX_CACHE_ENTRIES:
            return
        entries.sort(key=lambda p: p.stat().st_mtime)
        for old in entries[: len(entries) - MAX_CACHE_ENTRIES]:
            shutil.rmtree(old, ignore_errors=True)

    def _exec(self, lang: Language, argv, files: dict[str, Path], stdin: bytes, limits: Limits, job: Path, *,
              inputs: dict[str, bytes] | None = None, fetch: tuple[str, ...] = ()) -> RawRun:
        """Run ``argv`` once; ``/work`` holds twice the file-size limit (at least 64 MiB) plus the input files."""
        work_mb = max(64, limits.file_size_mb * 2) + (sum(map(len, (inputs or {}).values())) >> 20)
        if self.zygote is not None and Zygote.accepts(argv, files, inputs=inputs, fetch=fetch, limits=limits,
                                                      env=lang.env):
            memory = (limits.memory_mb + lang.memory_overhead_mb) << 20
            rootless = self.mode == "rootless"
            raw = self.zygote.run(argv, files, stdin=stdin, limits=limits, work_mb=work_mb, memory=memory,
                                  processes=max(limits.processes, lang.min_processes),
                                  address_space=memory + (lang.address_space_mb << 20) if rootless else None)
            reap_orphans()
            return raw
        raw = execute(list(argv), limits=limits, stdin=stdin, identity=self.identity, cgroups=self.cgroups,
                      files=files, scratch=job / f"scratch-{uuid.uuid4().hex[:8]}", isolated=self.isolated,
                      env=lang.env, work_mb=work_mb, inputs=inputs, fetch=fetch,
                      extra_memory_mb=lang.memory_overhead_mb, min_processes=lang.min_processes,
                      rootless=self.mode == "rootless", address_space_mb=lang.address_space_mb, bwrap=self.bwrap)
        reap_orphans()
        return raw


def missing_toolchain(lang: Language) -> str | None:
    """Why ``lang`` cannot run here (a compiler or runtime binary missing from the host's /usr), else None."""
    for command in (lang.compile, lang.run):
        if command and command[0].startswith("/") and not os.access(command[0], os.X_OK):
            return f"the {lang.name} toolchain is not installed in this sandbox ({command[0]} is missing)"
    return None


def _cached_step(entry: Path) -> tuple[RunResult, float] | None:
    """A cache entry's compile result and the time limit it ran under, or None (not cached, unreadable)."""
    try:
        data = json.loads((entry / "result.json").read_text())
        return RunResult(**data["result"]), float(data["time_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _replace_entry(tmp: Path, entry: Path) -> None:
    """Move the filled ``tmp`` to ``entry``, replacing an older entry (a timeout under a smaller limit)."""
    if entry.exists():
        old = entry.with_name(f".old-{uuid.uuid4().hex}")
        try:
            entry.rename(old)
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.rename(entry)
    except OSError:  # another worker cached it first
        shutil.rmtree(tmp, ignore_errors=True)


def _optional_cgroups() -> CgroupManager | None:
    """Unsafe mode's best effort: per-run cgroups as root; without root the process tree is measured instead
    (a cgroup base left writable by an earlier root run must not be mistaken for one we can use)."""
    if os.geteuid() != 0:
        return None
    try:
        return CgroupManager()
    except (OSError, RuntimeError):
        return None


def to_run_result(raw: RawRun, limits: Limits) -> RunResult:
    out = raw.stdout.decode("utf-8", "replace")
    err = raw.stderr.decode("utf-8", "replace")
    common = dict(stdout=out, stderr=err, exit_code=raw.exit_code, signal=raw.signal, cpu_time_s=raw.cpu_time_s,
                  wall_time_s=raw.wall_time_s, memory_peak_bytes=raw.memory_peak_bytes)
    if raw.setup_error:
        return RunResult(verdict=SE, detail=raw.setup_error, **common)
    if raw.oom_killed or (raw.exit_code not in (0, None) or raw.signal) and any(m in err for m in _MEMORY_ERRORS):
        return RunResult(verdict=MLE, detail=f"memory limit {limits.memory_mb} MB", **common)
    if raw.wall_exceeded and limits.wall_time_s > 0:
        return RunResult(verdict=TLE, detail=f"wall-clock limit {limits.wall_time_s:g} s", **common)
    if raw.cpu_exceeded or raw.signal == signal.SIGXCPU:
        return RunResult(verdict=TLE, detail=f"CPU time limit {limits.time_s:g} s", **common)
    if raw.wall_exceeded:
        return RunResult(verdict=TLE, detail=f"wall-clock backstop {limits.wall_s:g} s", **common)
    if raw.output_exceeded or raw.signal == signal.SIGXFSZ:
        return RunResult(verdict=OLE, detail=f"output limit {limits.output_bytes} bytes", **common)
    if raw.signal:
        return RunResult(verdict=RE, detail=f"killed by signal {_signal_name(raw.signal)}", **common)
    if raw.exit_code:
        return RunResult(verdict=RE, detail=f"exit code {raw.exit_code}", **common)
    return RunResult(verdict=OK, **common)


def syntax_as_compile_error(lang: Language, run: RunResult) -> RunResult:
    """An interpreted program that died parsing its own source is a compile error, not a runtime error."""
    if run.verdict == RE and lang.compile is None and any(re.search(p, run.stderr, re.MULTILINE)
                                                           for p in lang.syntax_errors):
        return replace(run, verdict=CE, detail="syntax error")
    return run


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def worst(verdicts: list[str]) -> str:
    return min(verdicts, key=lambda v: SEVERITY.get(v, 0)) if verdicts else OK
