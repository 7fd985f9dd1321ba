"""`credo env serve` driven by a client written to AgentGym's contract (issue 20, item 1): the maze and wordle
clients of AgentGym's `agentenv` (`agentenv/envs/lmrlgym.py`) create an instance, reset by `{"game": i}` (maze)
or `{"seed": i}` (wordle, after `GET /filtered_vocab`), and send the text after the model's `Action:` in the
environment's own words. This client does what they do, over real HTTP."""
from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack

import pytest

from tests.env_util import env_server


@pytest.fixture
def served():
    """served(NAME) -> the URL of `credo env serve NAME` in a subprocess (stopped after the test)."""
    with ExitStack() as stack:
        yield lambda name: stack.enter_context(env_server(name))[0]


class AgentGymStyleClient:
    """The request sequence of AgentGym's LMRL-Gym clients (not their code): POST /create, /reset with the
    environment's index key, /step with the action words taken from the model's `Thought: ... Action:` text."""

    def __init__(self, base: str, reset_key: str):
        self.base, self.reset_key = base, reset_key
        self.env_id = self._post("create", {})["id"]

    def _post(self, path: str, data: dict) -> dict:
        data = {**data, "id": getattr(self, "env_id", None)} if path != "create" else data
        req = urllib.request.Request(f"{self.base}/{path}", data=json.dumps(data).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def get(self, path: str):
        with urllib.request.urlopen(f"{self.base}/{path}?id={self.env_id}", timeout=30) as r:
            return json.loads(r.read())

    def reset(self, idx: int) -> dict:
        return self._post("reset", {self.reset_key: idx})

    def step(self, model_text: str) -> dict:
        action = model_text.removesuffix("</s>")
        parts = action.split("Action:")
        action = (parts[1] if len(parts) > 1 else parts[0]).strip()
        return self._post("step", {"action": action})


def _maze_path(observation: str) -> list[str]:
    """Moves from 'at r,c goal R,C' on an empty maze (credo's maze default: no walls)."""
    words = observation.split()
    (r, c), (gr, gc) = (tuple(map(int, words[1].split(","))), tuple(map(int, words[3].split(","))))
    return ["down" if gr > r else "up"] * abs(gr - r) + ["right" if gc > c else "left"] * abs(gc - c)


def test_agentgym_maze_client_resets_by_game_and_moves_in_words(served):
    base = served("maze")
    client = AgentGymStyleClient(base, "game")
    firsts = {client.reset(i)["observation"] for i in range(8)}
    assert len(firsts) > 1  # the game index picks the task (it used to be ignored)
    obs = client.reset(5)["observation"]
    assert client.get("observation") == obs  # GET /observation: a bare string
    path = _maze_path(obs)
    for i, move in enumerate(path):
        out = client.step(f"Thought:\nThe goal is that way.\n\nAction:\nmove {move}</s>" if i % 2 else
                          f"Thought:\nGo.\n\nAction:\n{move}")  # AgentGym's format; a bare direction too
        assert "invalid" not in out["observation"]
    assert out["done"] and out["reward"] == 1.0


def test_agentgym_wordle_client_reads_the_vocabulary_and_guesses_in_letters(served):
    base = served("wordle")
    client = AgentGymStyleClient(base, "seed")
    vocab = client.get("filtered_vocab")
    assert isinstance(vocab, list) and all(isinstance(w, str) for w in vocab) and len(vocab) > 10
    secrets = set()
    for seed in (1, 2):
        assert client.reset(seed)["observation"]
        for word in vocab:  # letters separated by spaces, as AgentGym's prompt asks
            out = client.step("Thought:\nTry it.\n\nAction:\n" + " ".join(word))
            assert "invalid" not in out["observation"]
            if out["done"]:
                secrets.add(word)
                break
        assert out["done"] and out["reward"] == 1.0
    assert len(secrets) == 2  # the seed picks the word


@pytest.mark.parametrize("env,text,expected", [
    ("maze", "move:down", "move:down"),                       # credo's client (parsed already)
    ("maze", "I will <move>left</move> now", "move:left"),    # credo's tags in model text
    ("maze", "Thought:\nx\n\nAction:\nmove up", "move:up"),   # AgentGym's model text
    ("maze", "Action:\nfly", "Action:\nfly"),                 # nothing recognisable: the env calls it invalid
    ("wordle", "Action:\nf r o w n", "guess:frown"),
    ("wordle", "frown", "guess:frown"),
    ("maze", "<move>" * 20000 + "x", "<move>" * 20000 + "x"),  # over MAX_ACTION_CHARS: passed on unsearched
])
def test_actions_in_every_accepted_form(env, text, expected):
    from credo.envs.server import as_action

    assert as_action(env, text) == expected
