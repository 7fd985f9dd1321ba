"""On-policy distillation (issue 23): a frozen teacher scores the student's sampled tokens; the per-token reverse KL
is a dense reward, an advantage or a loss term. ``config``: the ``distill`` section; ``teacher``: loading the teacher
and its scoring pass; ``stage``: the RL step's distillation stage. The math: credo.algo.distill."""
