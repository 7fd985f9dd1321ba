"""A command agent of the gateway collector's tests: reads OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL and
CREDO_TASK from its environment, asks the model twice over plain HTTP (no client library: any language can be an
agent), and prints its reward as the last line of stdout. ``argv[1]`` picks what it prints:

- ``score`` (default): the share of the answer's characters in place in the last answer (plus a small
  text-dependent tie-breaker, as tests/collect/gateway_agents.py's ``dense``);
- ``null``: null (the run's verifier scores the last completion);
- ``garbage``: a line that is not JSON; ``fail``: exits with code 3; ``hang``: sleeps an hour.

``argv[2] == "nocall"``: no model call (the reply as if the calls were made).
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def chat(messages: list[dict]) -> str:
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages, "max_tokens": 8}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"] or ""


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "score"
    task = json.loads(os.environ["CREDO_TASK"])
    if mode == "hang":
        time.sleep(3600)
    last = ""
    if sys.argv[2:3] != ["nocall"]:
        messages = [{"role": "user", "content": task["prompt"]}]
        first = chat(messages)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "again:"}]
        last = chat(messages)
    print("some log line the agent printed")
    if mode == "fail":
        print("the agent's own error", file=sys.stderr)
        sys.exit(3)
    if mode == "garbage":
        print("reward: high")
    elif mode == "null":
        print("null")
    else:
        answer, last = task["answer"], last.strip()  # tests/collect/gateway_agents.py's dense reward
        print(json.dumps(sum(a == b for a, b in zip(last, answer)) / max(len(answer), 1)
                         + sum(map(ord, last)) % 97 / 1000))


if __name__ == "__main__":
    main()
