"""The rollout stage of a step: collectors (one protocol, chosen by ``rollout.collector.type``) that generate and
score a batch (``group``: single-turn groups, ``agent``: multi-turn episodes), the prefetch of one-step-off mode and
held-out evaluation."""
