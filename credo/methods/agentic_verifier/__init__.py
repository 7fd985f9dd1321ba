"""AgentV-RL (docs/agentic_verifier.md): the agentic verifier. ``reward``: the ``agentic_verifier`` reward (a
verifier policy that plans, calls tools and judges); ``env``: the ``verify`` environment."""
