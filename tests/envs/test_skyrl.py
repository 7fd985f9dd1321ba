"""skyrl-gym environments as credo environments (``skyrl_gym:<id>``, credo.envs.skyrl): the real skyrl-gym package's
gsm8k, gsm8k_multi_turn, text2sql (on a sqlite database built here) and search (against a retrieval server stand-in
on 127.0.0.1) with hand-checked rewards, the rendering
against SkyRL's own (the chat template over the prompt and observation messages), config errors, and a tiny
``credo train`` of the agent collector on a SkyRL-format parquet file."""
from __future__ import annotations

import json
import re
import sqlite3
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from credo.config import ConfigError, load_config
from credo.envs import EVAL_OFFSET, EnvError, LocalEnvClient, get_env_spec
from credo.envs.skyrl import observation_text
from credo.rollout.agent_loop import chat_template
from tests.conftest import TINY_RUN
from tests.env_util import JSONHandler
from tests.tools.tool_templates import chat_tokenizer

QUESTIONS = [("What is 40+2?", "42"), ("What is 3*3?", "9"), ("What is 10-3?", "7"), ("What is 2+2?", "4")]
SUFFIX = " Let's think step by step and output the final answer after \"####\"."


def gsm8k_rows(pairs, *, system: str | None = None, env_class: str = "gsm8k") -> list[dict]:
    """Rows in the layout of SkyRL's examples/gsm8k/gsm8k_dataset.py."""
    rows = []
    for i, (q, a) in enumerate(pairs):
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q + SUFFIX}]
        rows.append({"data_source": "openai/gsm8k", "prompt": prompt, "env_class": env_class,
                     "reward_spec": {"method": "rule", "ground_truth": a},
                     "extra_info": {"split": "train", "index": i, "answer": f"#### {a}", "question": q}})
    return rows


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture
def gsm8k_file(tmp_path):
    return write_parquet(tmp_path / "train.parquet", gsm8k_rows(QUESTIONS, system="Be brief."))


# ------------------------------------------------------------------------------------------ gsm8k (single turn)

def test_gsm8k_rewards_are_skyrl_gyms_own(gsm8k_file):
    client = LocalEnvClient("skyrl_gym:gsm8k", data=gsm8k_file)
    assert client.reset(0) == "What is 40+2?" + SUFFIX and client.instruction == "Be brief."
    right = client.step("40 plus 2 is 42.\n#### 42")
    assert (right.reward, right.done, right.info["success"], right.observation) == (1.0, True, True, "")
    client.reset(0)
    wrong = client.step("#### 41")
    assert (wrong.reward, wrong.done, wrong.info["success"]) == (0.0, True, False)
    client.reset(0)
    assert client.step("The answer is 42.").reward == 0.0  # no "#### ": gsm8k's strict format scores 0
    client.reset(1)
    assert client.step("#### 9").reward == 1.0 and client.step  # row 1's ground truth
    client.close()


def test_task_ids_map_onto_the_rows_of_data_and_eval_data(tmp_path, gsm8k_file):
    spec = get_env_spec("skyrl_gym:gsm8k")
    params = {**spec.params, "data": gsm8k_file}
    assert spec.task_space(params, "train") == (0, 4)
    assert spec.task_space(params, "eval") == (EVAL_OFFSET, EVAL_OFFSET + 4)  # no eval_data: the data rows
    held_out = write_parquet(tmp_path / "test.parquet", gsm8k_rows([("What is 5+6?", "11")]))
    params["eval_data"] = held_out
    assert spec.task_space(params, "eval") == (EVAL_OFFSET, EVAL_OFFSET + 1)
    client = LocalEnvClient("skyrl_gym:gsm8k", data=gsm8k_file, eval_data=held_out)
    assert client.reset(EVAL_OFFSET).startswith("What is 5+6?") and client.instruction == ""
    assert client.step("#### 11").reward == 1.0
    assert client.reset(3).startswith("What is 2+2?")
    with pytest.raises(EnvError, match="outside the 1 rows of eval_data"):
        client.reset(EVAL_OFFSET + 1)
    with pytest.raises(EnvError, match="outside the 4 rows of data"):
        client.reset(4)


def test_rows_of_another_env_class_are_left_out(tmp_path):
    rows = gsm8k_rows(QUESTIONS[:2]) + gsm8k_rows(QUESTIONS[2:], env_class="gsm8k_multi_turn")
    path = write_parquet(tmp_path / "mixed.parquet", rows)
    spec = get_env_spec("skyrl_gym:gsm8k")
    assert spec.task_space({**spec.params, "data": path}, "train") == (0, 2)
    multi = get_env_spec("skyrl_gym:gsm8k_multi_turn")
    client = LocalEnvClient("skyrl_gym:gsm8k_multi_turn", data=path)
    assert multi.task_space({**multi.params, "data": path}, "train") == (0, 2)
    assert client.reset(0).startswith("What is 10-3?")


def test_a_served_skyrl_gym_env_hands_its_tasks_instruction_to_the_http_client(gsm8k_file):
    from credo.envs import HTTPEnvClient
    from tests.env_util import env_server

    with env_server("skyrl_gym:gsm8k", f"data={gsm8k_file}") as (url, _):
        client = HTTPEnvClient(url, "skyrl_gym:gsm8k")
        assert client.reset(0).startswith("What is 40+2?") and client.instruction == "Be brief."
        assert client.step("#### 42").reward == 1.0
        client.close()


def test_jsonl_rows_work_too_and_bad_rows_are_skipped_with_a_warning(tmp_path):
    from credo.data.files import BadRowsWarning

    path = tmp_path / "rows.jsonl"
    no_truth = {"prompt": [{"role": "user", "content": "1+1?"}], "env_class": "gsm8k"}
    path.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(QUESTIONS[:2]))
                    + "{not json\n" + json.dumps(no_truth) + "\n")
    with pytest.warns(BadRowsWarning, match=r"skipped 2 of 4 rows: rows.jsonl:3: not a JSON object; "
                                            r"rows.jsonl:4: no reward_spec.ground_truth"):
        client = LocalEnvClient("skyrl_gym:gsm8k", data=str(path))
    assert len(client.env.train_rows) == 2
    client.reset(1)
    assert client.step("#### 9").reward == 1.0


def test_aime_reads_its_ground_truth_from_reward_model(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Compute 2^10. End with 'Answer: N'."}], "env_class": "aime",
             "reward_model": {"ground_truth": "1024", "style": "rule"}}]
    data = write_parquet(tmp_path / "aime.parquet", rows)
    with pytest.raises(ValueError, match="no reward_spec.ground_truth"):  # the default field: every row is bad
        LocalEnvClient("skyrl_gym:aime", data=data)
    client = LocalEnvClient("skyrl_gym:aime", data=data, ground_truth_field="reward_model.ground_truth")
    for text, reward in (("2^10 = 1024\nAnswer: 1024", 1.0), ("Answer: 1000", -1.0), ("1024", -1.0)):
        client.reset(0)
        assert client.step(text).reward == reward, text  # aime scores a wrong or unformatted answer -1


# ------------------------------------------------------------------------------------------ gsm8k_multi_turn

def test_multi_turn_gsm8k_sums_its_turn_rewards_as_skyrl_does(gsm8k_file):
    client = LocalEnvClient("skyrl_gym:gsm8k_multi_turn", data=gsm8k_file, env_class="gsm8k", max_turns=3)
    client.reset(0)
    first = client.step("maybe #### 41")  # well formatted, wrong: 0.2 / max_turns
    assert first.reward == pytest.approx(0.2 / 3) and not first.done and first.info == {}
    assert first.observation.startswith("Please provide your step-by-step reasoning")
    second = client.step("no number at all")  # no "#### ": nothing this turn
    assert second.reward == pytest.approx(0.2 / 3) and not second.done
    assert second.observation.startswith("Now provide only the final numeric answer")  # the last turn's prompt
    last = client.step("#### 42")
    assert last.done and last.info["success"] and last.reward == pytest.approx(1.0 + 0.2 / 3)
    last_only = LocalEnvClient("skyrl_gym:gsm8k_multi_turn", data=gsm8k_file, env_class="gsm8k", max_turns=3,
                               reward="last")
    last_only.reset(0)
    last_only.step("#### 41")
    assert last_only.step("#### 42").reward == 1.0
    out_of_turns = LocalEnvClient("skyrl_gym:gsm8k_multi_turn", data=gsm8k_file, env_class="gsm8k", max_turns=2)
    out_of_turns.reset(1)
    out_of_turns.step("#### 8")
    end = out_of_turns.step("#### 8")  # the environment ends the episode at its max_turns: not a success
    assert end.done and not end.info["success"] and end.reward == pytest.approx(0.2)


# ------------------------------------------------------------------------------------------ text2sql

@pytest.fixture
def sql_rows(tmp_path):
    """A spider-layout database directory (DB_PATH/spider/database/<db_id>/<db_id>.sqlite) and two SkyRL rows."""
    db_dir = tmp_path / "sql" / "spider" / "database" / "shop"
    db_dir.mkdir(parents=True)
    con = sqlite3.connect(db_dir / "shop.sqlite")
    con.executescript("CREATE TABLE item (name TEXT, price INT);"
                      "INSERT INTO item VALUES ('pen', 2), ('book', 12), ('lamp', 30);")
    con.commit()
    con.close()
    rows = [{"prompt": [{"role": "system", "content": "Answer with SQL in <solution></solution>; explore with "
                         "<sql></sql>; think in <think></think>."},
                        {"role": "user", "content": q}],
             "env_class": "text2sql", "db_id": "shop", "data": "spider",
             "reward_spec": {"method": "rule", "ground_truth": gold}}
            for q, gold in (("Names of items over 10?", "SELECT name FROM item WHERE price > 10"),
                            ("How many items?", "SELECT count(*) FROM item"))]
    return write_parquet(tmp_path / "sql.parquet", rows), str(tmp_path / "sql")


def test_text2sql_runs_queries_and_scores_the_solution(sql_rows):
    data, db_path = sql_rows
    client = LocalEnvClient("skyrl_gym:text2sql", data=data, env_config={"db_path": db_path}, max_turns=3)
    assert client.reset(0) == "Names of items over 10?" and client.instruction.startswith("Answer with SQL")
    explore = client.step("<think>look at prices</think><sql>SELECT name, price FROM item WHERE price > 10</sql>")
    assert not explore.done and explore.reward == 0.0
    assert "book" in explore.observation and "lamp" in explore.observation and "pen" not in explore.observation
    assert "You have 2 turns left" in explore.observation
    right = client.step("<think>both</think><solution>SELECT name FROM item WHERE price >= 12</solution>")
    assert right.done and right.reward == 1.0 and right.info["success"]

    client.reset(0)
    wrong = client.step("<think>all</think><solution>SELECT name FROM item</solution>")
    assert wrong.done and wrong.reward == 0.0 and not wrong.info["success"]
    client.reset(1)
    unformatted = client.step("<solution>SELECT count(*) FROM item</solution>")  # no <think>: a format error
    assert unformatted.done and unformatted.reward == -1.0
    client.reset(1)
    bad = client.step("<think>x</think><sql>SELECT nope FROM item</sql>")
    assert not bad.done and "Error executing SQL" in bad.observation
    client.close()


def test_text2sql_without_its_database_is_an_env_failure(sql_rows, tmp_path):
    data, _ = sql_rows
    client = LocalEnvClient("skyrl_gym:text2sql", data=data, env_config={"db_path": str(tmp_path / "none")})
    with pytest.raises(EnvError, match="Database file not found"):
        client.reset(0)


# ------------------------------------------------------------------------------------------ search

class RetrievalHandler(JSONHandler):
    """A stand-in for Search-R1's retrieval server (POST /retrieve {query, topk, return_scores} -> {result: [[
    {document: {contents}, score}, ...]]}) on 127.0.0.1: skyrl-gym's search environment has no offline mode."""

    queries: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.queries.append(body)
        docs = [{"document": {"contents": f"\"France\"\nParis is the capital of France ({i})."}, "score": 1.0 - i}
                for i in range(body["topk"])]
        self._reply(200, json.dumps({"result": [docs]}).encode())


def test_search_queries_a_retrieval_server_and_scores_exact_match(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "What is the capital of France? Search with <search>query"
                         "</search>, answer in <answer></answer>."}],
             "env_class": "search", "data_source": "nq",
             "reward_spec": {"method": "rule", "ground_truth": {"target": ["Paris"]}},
             "extra_info": {"index": 0, "split": "train"}}]
    data = write_parquet(tmp_path / "search.parquet", rows)
    server = ThreadingHTTPServer(("127.0.0.1", 0), RetrievalHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
        client = LocalEnvClient("skyrl_gym:search", data=data, max_turns=3,
                                env_config={"search_url": url, "topk": 2, "log_requests": False})
        client.reset(0)
        found = client.step("<search>capital of France</search>")
        assert not found.done and found.reward == 0.0 and RetrievalHandler.queries[-1]["query"] == "capital of France"
        assert found.observation.startswith("\n<information>") and "Doc 2: " in found.observation
        right = client.step("<answer>paris</answer>")  # exact match after SQuAD normalisation
        assert right.done and right.reward == 1.0 and right.info["success"]
        client.reset(0)
        wrong = client.step("<answer>Lyon</answer>")
        assert wrong.done and wrong.reward == 0.0
        client.close()
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------ rendering

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_an_episode_renders_as_skyrls_chat_history(gsm8k_file):
    """credo's token layout of a multi-turn episode is the chat template over SkyRL's chat history (the prompt's
    messages, each assistant turn, each observation message), as SkyRL's generator builds it."""
    tok = chat_tokenizer(CHATML)
    template = chat_template(tok)
    client = LocalEnvClient("skyrl_gym:gsm8k_multi_turn", data=gsm8k_file, env_class="gsm8k", max_turns=3)
    first = client.reset(0)
    ids = template.prompt(client.instruction, first)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 40+2?" + SUFFIX}]
    for action in ("#### 41", "#### 42"):
        ids = ids + template.assistant_prefix + list(tok(action, add_special_tokens=False)["input_ids"]) \
            + [template.end_of_turn]
        history.append({"role": "assistant", "content": action})
        result = client.step(action)
        if not result.done:
            ids = ids + template.observation(result.observation)
            history.append({"role": "user", "content": result.observation})
    assert result.done and result.reward == pytest.approx(1.0 + 0.2 / 3)
    skyrl = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=False)
    # both end the episode at the model's end-of-turn token (SkyRL drops what the template adds after its last EOS)
    assert tok.decode(ids) == skyrl.removesuffix("\n") and skyrl.endswith("#### 42<|im_end|>\n")


def test_observation_messages_join_into_one_turn():
    assert observation_text([]) == "" and observation_text(None) == ""
    assert observation_text([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb"


# ------------------------------------------------------------------------------------------ config

AGENT = ["rollout.collector.type=agent", "warm_start.steps=0"]


def _cfg(*overrides: str):
    return load_config(None, [*AGENT, *overrides])


def test_config_names_resolve_and_bad_ones_are_one_line_errors(gsm8k_file, tmp_path):
    params = f"rollout.collector.env_params={{'skyrl_gym:gsm8k': {{data: '{gsm8k_file}'}}}}"
    cfg = _cfg("rollout.collector.envs=['skyrl_gym:gsm8k']", params)
    assert cfg.rollout.collector.envs == ["skyrl_gym:gsm8k"]
    cases = [
        (["rollout.collector.envs=['skyrl_gym:gsm9k']", params.replace("gsm8k", "gsm9k", 1)],
         "unknown skyrl-gym environment 'gsm9k'"),
        (["rollout.collector.envs=['skyrl_gym:gsm8k']"], "parameter data must be the path"),
        (["rollout.collector.envs=['skyrl_gym:gsm8k']", params.replace(gsm8k_file, str(tmp_path / "no.parquet"))],
         "No such file"),
        (["rollout.collector.envs=['skyrl_gym:gsm8k']", params.replace("}}", ", reward: mean}}")],
         "reward='mean' must be sum or last"),
        (["rollout.collector.envs=['skyrl_gym:gsm8k']", params.replace("}}", ", temperature: 1}}")],
         "has no parameter"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            _cfg(*overrides)
    with pytest.raises(ConfigError, match="skyrl_gym:gsm8k has no oracle"):
        load_config(None, ["rollout.collector.type=agent", "rollout.collector.envs=['skyrl_gym:gsm8k']", params])


def test_a_prompt_credo_cannot_open_an_episode_with_is_refused_at_load(tmp_path):
    rows = gsm8k_rows(QUESTIONS[:1])
    rows[0]["prompt"] = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "#### 2"},
                         {"role": "user", "content": "2+2?"}]
    path = write_parquet(tmp_path / "fewshot.parquet", rows)
    with pytest.raises(ValueError, match=r"prompt roles \['user', 'assistant', 'user'\]"):
        LocalEnvClient("skyrl_gym:gsm8k", data=path)


# ------------------------------------------------------------------------------------------ credo train

@pytest.fixture
def scripted(monkeypatch):
    """Every other continuation of a batch is replaced by a gsm8k answer: the right one on even prompts' turns,
    a wrong one (the truth plus one) on the others, so rewards of both kinds come from skyrl-gym."""
    from credo.rollout.hf import Continuation, HFRolloutEngine

    real = HFRolloutEngine.continue_ids
    truths = dict(QUESTIONS)

    def continue_ids(self, prefixes, sampling, *, stop_ids=(), top_logprobs=0, stop_sequences=(), **kw):
        out = real(self, prefixes, sampling, stop_ids=stop_ids, top_logprobs=top_logprobs,
                   stop_sequences=stop_sequences, **kw)
        for i, prefix in enumerate(prefixes):
            if i % 2 == 0:
                text = self.tokenizer.decode(prefix)
                truth = next(a for q, a in truths.items() if q in text)
                answer = truth if i % 4 == 0 else str(int(truth) + 1)
                ids = list(self.tokenizer(f"#### {answer}", add_special_tokens=False)["input_ids"]) + [self.eos_id]
                out[i] = Continuation(ids, [-0.5] * len(ids), "stop", None)
        return out

    monkeypatch.setattr(HFRolloutEngine, "continue_ids", continue_ids)


def test_credo_train_on_a_skyrl_gym_environment(tmp_path, gsm8k_file, scripted):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    code = main(["train", *TINY_RUN, "rollout.collector.type=agent", "rollout.collector.envs=['skyrl_gym:gsm8k']",
                 f"rollout.collector.env_params={{'skyrl_gym:gsm8k': {{data: '{gsm8k_file}'}}}}",
                 "rollout.collector.max_turns=1", "rollout.collector.max_tokens_per_turn=8",
                 "rollout.collector.max_response_tokens=32", "model.max_position_embeddings=256", "warm_start.steps=0",
                 "task.eval_size=2", "eval.every=0", "eval.k=1", "train.steps=2", "log.rollouts_every=1",
                 "log.tensorboard=false", "log.report=false", "log.progress=false", "checkpoint.save_final=false",
                 f"output_dir={tmp_path}", "run_name=skyrl"])
    assert code == 0
    run = tmp_path / "skyrl"
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 * 4 and {r["step"] for r in rows} == {1, 2}
    truths = dict(QUESTIONS)
    for row in rows:
        assert row["uid"].startswith("skyrl_gym:gsm8k/train/") and 0 <= int(row["uid"].split("/")[-1]) < 4
        assert row["prompt"].startswith("Be brief.\nWhat is") and not row["failed"]
        truth = next(a for q, a in truths.items() if q in row["prompt"])
        m = re.search(r"#### (\-?[0-9\.\,]+)", row["response"])  # gsm8k's strict rule, by hand
        assert row["score"] == (1.0 if m and m.group(1).replace(",", "") == truth else 0.0), row["response"]
        assert row["correct"] == (row["score"] == 1.0)
    scores = [r["score"] for r in rows]
    assert scores.count(1.0) >= 8 and scores.count(0.0) >= 8  # the scripted right and wrong answers
    metrics = read_metrics(run / "metrics.jsonl")
    steps = [m for m in metrics if "agent/success_rate" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["agent/env_failures"] == 0 for m in steps)
    assert all(m["agent/success_rate"] > 0 for m in steps)
    assert any("eval/greedy_acc" in m for m in metrics)  # the held-out rows were evaluated too
