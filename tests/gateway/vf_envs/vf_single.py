"""A single-turn verifiers v1 environment for credo's tests (tests/gateway/test_verifiers_env.py): sums of two
numbers, scored by an exact-match ``@vf.reward`` and, when ``args.task.judges`` plugs one, verifiers' reference
judge."""
import verifiers.v1 as vf

PROBLEMS = [(2, 3), (4, 5), (10, 7), (6, 6), (1, 8), (9, 9)]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip().endswith(self.data.answer) else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    count: int = len(PROBLEMS)
    offset: int = 0


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for a, b in PROBLEMS[self.config.offset:self.config.offset + self.config.count]:
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Reply with the number last.",
                                  system_prompt="You add numbers.", answer=str(a + b)),
                          self.config.task)


__all__ = ["SumTaskset"]


async def has_digit(task, trace) -> float:
    """A reward to plug through ``args.task.rewards`` (verifiers' plugged functions): 1 when the reply holds a
    digit, so a random tiny policy's episodes of one prompt differ (credo train's test)."""
    return 1.0 if any(c.isdigit() for c in trace.last_reply) else 0.0
