"""Multi-stage paper methods, each a package holding its pieces together: its pure math (``algo``), its
procedure (a collector, a token selector, a training recipe), its config section (``config``) and its CLI entry.

=====================  ==================================================================================
``attnrl``             AttnRL: FCI attention pass, tree rollouts branched at high-FCI steps (collector ``tree``)
``rlep``               RLEP: a pool of verified answers replayed into every group (``replay`` section)
``vepo``               VEPO: grounding-sensitive token selection (``token_select.type=vepo``)
``birm``               BiRM: a bidirectional process reward model, best-of-N and beam search (``credo rm train``)
``reward_models``      Bradley-Terry ORM, CRM's peer-reviewing pair, ID-RM (``idrm``) (``credo rm train``)
``agentic_verifier``   AgentV-RL: a verifier policy that plans, calls tools and judges (reward and env)
``dvpo``               DVPO: a quantile critic's loss and distributional GAE (``critic.loss=dvpo``)
``dfpo``               DFPO: a value-flow critic head, its loss and estimator (``critic.head=flow``)
=====================  ==================================================================================

Single-function losses and estimators stay in :mod:`credo.algo`, and so does a method's math that the trainer's
generic passes use (:mod:`credo.algo.dvpo`, :mod:`credo.algo.dfpo`). Nothing below ``credo.recipes`` imports a
method package except through a registry that names it (docs/extending.md).
"""
