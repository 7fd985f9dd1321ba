"""Agent RL end to end: a real env server process, RL steps through the HTTP client, the trained batch checked
token by token against the spec's layout (``agents-and-sandboxes.md`` §2.2), and env faults inside a step."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.envs import EVAL_OFFSET, LocalEnvClient
from credo.envs.builtin import CalcEnv
from credo.models.tokenizer import build_char_tokenizer
from credo.rollout.agent_loop import plain_template
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_RUN
from tests.env_util import JSONHandler, env_server

LOCK = threading.Lock()
AGENT_RUN = [*TINY_RUN, "agent.envs=[calc]", "agent.max_turns=3", "agent.max_tokens_per_turn=8",
             "agent.max_response_tokens=96", "model.max_position_embeddings=192", "task.eval_size=4", "eval.every=0",
             "log.tensorboard=false", "log.report=false", "log.progress=false", "checkpoint.save_final=false"]


def _script(monkeypatch, every: int) -> None:
    """Every ``every``-th continuation of a batch is replaced by a valid calc action, so the tiny barely-trained
    model still reaches the server (actions it garbles are parsed client-side and never sent):
    ``<tool>1+2</tool>`` until the prefix holds the tool's answer, then ``<answer>3</answer>``."""
    from credo.rollout.hf import Continuation, HFRolloutEngine

    real = HFRolloutEngine.continue_ids

    def continue_ids(self, prefixes, sampling, *, stop_ids=(), top_logprobs=0, stop_sequences=(), **kw):
        out = real(self, prefixes, sampling, stop_ids=stop_ids, top_logprobs=top_logprobs,
                   stop_sequences=stop_sequences, **kw)
        for i, prefix in enumerate(prefixes):
            if i % every == 0:
                text = "<answer>3</answer>" if "= 3\n" in self.tokenizer.decode(prefix) else "<tool>1+2</tool>"
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]
                out[i] = Continuation(ids, [-0.5] * len(ids), "stop",
                                      out[i].top_logprobs[:1].expand(len(ids), -1) if top_logprobs else None)
        return out

    monkeypatch.setattr(HFRolloutEngine, "continue_ids", continue_ids)


@pytest.fixture
def half_scripted(monkeypatch):
    """Half of the turns are the model's own, half scripted valid actions."""
    _script(monkeypatch, 2)


@pytest.fixture
def scripted(monkeypatch):
    _script(monkeypatch, 1)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _replay_layout(row: dict, tok) -> tuple[list[int], list[int], float]:
    """The response ids and loss mask the spec prescribes for this episode, rebuilt by replaying the model's
    actions (decoded from its own turn tokens) in a local copy of the environment."""
    template = plain_template(tok)
    client = LocalEnvClient("calc")
    task_id = int(row["uid"].split("/")[-1])
    first_obs = client.reset(task_id)
    assert row["prompt_ids"] == template.prompt(client.instruction, first_obs)
    ids: list[int] = []
    mask: list[int] = []
    reward = 0.0
    for k, (start, end) in enumerate(row["turns"]):
        turn = row["response_ids"][start:end]
        ids += template.assistant_prefix  # empty for the plain template
        mask += [0] * len(template.assistant_prefix)
        ids += turn  # the model's tokens, its end-of-turn (EOS) included: mask 1
        mask += [1] * len(turn)
        ended = turn[-1] == template.end_of_turn
        result = client.step(tok.decode(turn[:-1] if ended else turn, skip_special_tokens=True))
        reward = result.reward
        if k + 1 < len(row["turns"]):  # an observation follows every turn but the last: mask 0
            obs = template.observation(result.observation)
            ids += obs
            mask += [0] * len(obs)
    return ids, mask, reward


def test_rl_through_a_real_env_server_trains_on_the_spec_layout(tmp_path: Path, half_scripted):
    with env_server("calc") as (url, _):
        code = main(["train", *AGENT_RUN, f"output_dir={tmp_path}", "run_name=http", "train.steps=2",
                     f"agent.server_urls={{calc: '{url}'}}", "log.rollouts_every=1"])
        assert code == 0
        with urllib.request.urlopen(url + "/stats") as resp:
            stats = json.loads(resp.read())
    run = tmp_path / "http"
    rows = _rows(run / "rollouts.jsonl")
    # 2 steps x 4 prompts x group 4, plus the held-out evaluation, all served by the server process
    assert len(rows) == 2 * 4 * 4 and {r["step"] for r in rows} == {1, 2}
    assert stats["created"] >= 2 * 16 and stats["steps"] > 0 and stats["live"] == 0  # every instance closed
    tok = build_char_tokenizer()  # the tokenizer of every freshly built credo model
    for row in rows:
        ids, mask, reward = _replay_layout(row, tok)
        assert row["response_ids"] == ids, row["uid"]
        assert row["response_mask"] == mask, row["uid"]
        assert row["score"] == reward and not row["failed"]
        # advantages live on the model's own tokens only (observations carry no gradient)
        assert all(a == 0 for a, m in zip(row["advantages"], row["response_mask"]) if m == 0)
    assert any(len(r["turns"]) > 1 for r in rows), "some episode should have an observation between turns"
    metrics = read_metrics(run / "metrics.jsonl")
    assert [m["step"] for m in metrics if "agent/env_failures" in m] == [1, 2]
    assert all(m["agent/env_failures"] == 0 for m in metrics if "agent/env_failures" in m)


# ----------------------------------------------------------------------------- faults inside a training step

class _Handler(JSONHandler):
    """A calc server whose training instances fail in the order their first /step arrives: the 1st answers
    HTTP 500, the 2nd hangs past the client's timeout, the 3rd sends malformed JSON, and at the 4th's second
    /step the whole server goes away (as if killed), after every first turn has been answered. Held-out
    evaluation instances (task ids >= EVAL_OFFSET) behave, so the step-0 evaluation does not trigger faults."""

    envs: dict[int, CalcEnv]
    fault_of: dict[int, int]
    counters: dict[str, int]
    server: ThreadingHTTPServer

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with LOCK:
            if self.path == "/create":
                env_id = self.counters["ids"] = self.counters["ids"] + 1
                self.envs[env_id] = CalcEnv()
                return self._reply(200, json.dumps({"id": env_id}).encode())
            env_id = body.get("id")
            if self.path == "/close":
                return self._reply(200, b'{"closed": true}')
            if self.path == "/reset":
                task_id = int(body["data_idx"])
                if task_id < EVAL_OFFSET:
                    self.fault_of[env_id] = 0  # a training instance: its fault is set by its first /step
                obs = self.envs[env_id].reset(task_id)
                return self._reply(200, json.dumps({"observation": obs}).encode())
            if self.fault_of.get(env_id) == 0:
                self.fault_of[env_id] = self.counters["train"] = self.counters["train"] + 1
            fault = self.fault_of.get(env_id, -1)
            self.counters[f"steps/{env_id}"] = n_step = self.counters.get(f"steps/{env_id}", 0) + 1
        if fault == 1:
            return self._reply(500, b'{"detail": "boom"}')
        if fault == 2:
            time.sleep(3)
            return self._reply(200, b"{}")
        if fault == 3:
            return self._reply(200, b'{"observation": "x", "reward": ')
        if fault == 4 and n_step == 1:
            return self._reply(200, b'{"observation": "= 0", "reward": 0, "done": false}')
        if fault == 4:
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            self.server.socket.close()
            self.connection.close()
            return None
        r = self.envs[env_id].step(body["action"])
        return self._reply(200, json.dumps({"observation": r.observation, "reward": r.reward, "done": r.done,
                                            "info": r.info}).encode())


@pytest.fixture
def faulty_calc():
    handler = type("H", (_Handler,), {"envs": {}, "fault_of": {}, "counters": {"ids": 0, "train": 0}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.server = server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()


def test_env_faults_end_their_episodes_and_the_step_completes(tmp_path: Path, faulty_calc, scripted, caplog):
    """Env faults end their episodes; the failed episodes are counted, logged and left out of the update (issue
    17 item 7; ``agent.max_env_failure_share=1`` so that the mostly failed step is not stopped)."""
    code = main(["train", *AGENT_RUN, f"output_dir={tmp_path}", "run_name=faults", "train.steps=1",
                 "warm_start.steps=0", f"agent.server_urls={{calc: '{faulty_calc}'}}", "agent.timeout_s=0.5",
                 "agent.retries=1", "log.rollouts_every=1", "eval.every=0", "task.eval_size=1", "eval.k=1",
                 "agent.max_env_failure_share=1.0"])
    assert code == 0
    run = tmp_path / "faults"
    (step1,) = [m for m in read_metrics(run / "metrics.jsonl") if m["step"] == 1]
    n_failed = step1["agent/env_failures"]
    assert n_failed == step1["env/failed_episodes"] >= 4
    (warning,) = [r.getMessage() for r in caplog.records if "failed in the environment" in r.getMessage()]
    for needle in ("HTTP 500", "timed out", "malformed JSON"):
        assert needle in warning, needle
    assert any(w in warning for w in ("refused", "Connection", "closed", "Remote")), warning  # the server went away
    rows = _rows(run / "rollouts.jsonl") if (run / "rollouts.jsonl").is_file() else []
    assert len(rows) == 16 - step1["env/dropped_episodes"] and not any(r["failed"] for r in rows)
    if not rows:  # every group lost all but at most one episode: nothing to train on
        assert step1["train/skipped_step"] == 1
    else:
        assert "actor/grad_norm" in step1  # the optimizer stepped on the valid episodes
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1


# ----------------------------------------------------------------------------- resume and presets


AGENT_PRESETS = ["agent_calc", "agent_maze", "agent_wordle", "agent_scaling_inter", "agent_mixture",
                 "agent_sequential", "agent_cross_env", "agent_arpo", "agent_aepo", "agent_toolgraph", "agent_tools"]


def test_every_agent_preset_runs_through_the_cli(tmp_path: Path):
    presets = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs").glob("agent_*.yaml")
                     if p.stem != "agent_agentgym")  # needs a server: tests/envs/test_agentgym_client.py runs it
    assert presets == sorted(AGENT_PRESETS)
    for preset in presets:
        run = tmp_path / preset
        code = main(["-q", "train", "--config", preset, "--run-dir", str(run), *TINY_RUN, "train.steps=2",
                     "eval.every=0", "task.eval_size=2", "eval.k=2", "log.report=false", "log.tensorboard=false",
                     "warm_start.steps=2", "agent.max_turns=2", "checkpoint.save_final=false"])
        assert code == 0, preset
        rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
        assert len(rows) == 2 and all("agent/success_rate" in r for r in rows), preset
        if preset in ("agent_arpo", "agent_aepo"):
            assert all("agent/branch/global" in r for r in rows), preset
        evals = read_metrics(run / "metrics.jsonl")[0]
        if preset in ("agent_mixture", "agent_cross_env", "agent_sequential"):
            assert any(k.endswith("/greedy_success") for k in evals), preset
