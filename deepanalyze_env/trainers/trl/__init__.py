"""TRL adapter: ``rollout`` (the multi-turn ``rollout_func`` and the env reward) and ``train``
(the ``backend: trl`` recipe runner). Needs the ``trl`` extra."""
