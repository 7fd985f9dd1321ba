"""A multi-turn verifiers v1 environment with a tool for credo's tests (tests/gateway/test_verifiers_env.py):
the taskset's MCP tool server (a ``vf.Toolset`` shared by its tasks, started once per serving by verifiers as
``python -m vf_tool``) multiplies two numbers; ``used_tool`` checks that a tool result reached the conversation,
``correct`` the final answer."""
import verifiers.v1 as vf

PROBLEMS = [(3, 4), (6, 7), (12, 11)]


class Calculator(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def multiply(self, a: int, b: int) -> str:
        """Multiply two integers."""
        return f"product={a * b}"


class MulData(vf.TaskData):
    answer: str


class MulTask(vf.Task[MulData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip().endswith(self.data.answer) else 0.0

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return 1.0 if any(f"product={self.data.answer}" in str(m.content) for m in trace.tool_messages) else 0.0


class MulTasksetConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class MulTaskset(vf.Taskset[MulTask, MulTasksetConfig]):
    @classmethod
    def toolsets(cls, config: MulTasksetConfig) -> list[vf.Toolset]:
        return [Calculator(config.tools)]

    def load(self):
        for a, b in PROBLEMS:
            yield MulTask(MulData(prompt=f"Use the tool to multiply {a} by {b}; end with the product.",
                                  answer=str(a * b)), self.config.task)


__all__ = ["MulTaskset"]

if __name__ == "__main__":
    Calculator.run()
