"""An OpenAI-compatible gateway in front of the policy's rollout engine: the user's own agent (a Python callable,
a command, a verifiers environment) calls ``/v1/chat/completions`` on 127.0.0.1 and credo records every call as
the exact token ids and sampler log-probs the engine saw and produced (docs/bring-your-own.md).

Layer: above credo.rollout (the engines it serves), below credo.collect (the ``gateway`` collector that runs the
agents). :mod:`credo.gateway.contract` is what an agent is handed and may return.
"""
