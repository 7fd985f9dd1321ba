"""Resource limits of one sandboxed run and the verdict names."""
from __future__ import annotations

from dataclasses import dataclass, field

# run verdicts
OK, CE, RE, TLE, MLE, OLE, SE = "OK", "CE", "RE", "TLE", "MLE", "OLE", "SE"
# judge verdicts add accepted / wrong answer
AC, WA = "AC", "WA"
RUN_VERDICTS = (OK, CE, RE, TLE, MLE, OLE, SE)
JUDGE_VERDICTS = (AC, WA, CE, RE, TLE, MLE, OLE, SE)
# worst-first order used to summarise many tests (SE is an infrastructure failure, never a wrong answer)
SEVERITY = {SE: 0, CE: 1, RE: 2, MLE: 3, TLE: 4, OLE: 5, WA: 6, AC: 7, OK: 7}


@dataclass(frozen=True)
class Limits:
    """Limits of one run. Time is CPU time; ``wall_factor`` gives the wall-clock backstop."""

    time_s: float = 2.0  # CPU seconds; exceeding it is TLE
    memory_mb: int = 256  # cgroup memory limit (RSS + page cache of the run); exceeding it is MLE
    output_bytes: int = 1 << 20  # cap on stdout and on stderr, each; exceeding the stdout cap is OLE
    processes: int = 32  # cgroup pids limit (threads count)
    file_size_mb: int = 16  # RLIMIT_FSIZE for files the program writes
    open_files: int = 64  # RLIMIT_NOFILE
    wall_factor: float = 3.0  # wall-clock backstop = wall_factor * time_s + 1 s (sleeping programs are TLE)
    extra_env: dict = field(default_factory=dict)  # extra environment variables (the environment is cleared)

    @property
    def wall_s(self) -> float:
        return self.wall_factor * self.time_s + 1.0


COMPILE_LIMITS = Limits(time_s=20.0, memory_mb=1024, output_bytes=64 << 10, processes=64, file_size_mb=256,
                        open_files=256, wall_factor=2.0)
