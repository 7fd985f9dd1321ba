"""AgentV-RL (seed-algorithms.md §18): the agentic verifier. ``reward``: the ``agentic_verifier`` reward (a
verifier policy that plans, calls tools and judges); ``env``: the ``verify`` environment."""
