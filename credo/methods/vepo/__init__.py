"""VEPO (docs/algorithms/vepo.md): grounding-sensitive token selection. ``algo``: Vis scores and the top-k
selection (pure math); ``grounding``: spans and perturbations; ``image``: image perturbations (vision-language
policies); ``select``: the token selector; ``config``: the
``token_select`` section of ``type: vepo``."""
