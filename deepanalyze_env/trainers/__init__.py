"""Trainer adapters: how the env plugs into TRL and SkyRL, and the recipe files that drive them.

- ``recipes``: YAML recipes (``deepanalyze-rl train RECIPE``) with dotted overrides.
- ``trl/``: the multi-turn ``rollout_func`` for TRL's ``GRPOTrainer`` and the ``train`` backend.
- ``skyrl/``: SkyRL's config subclass, the ``deepanalyze_grpo`` estimator, the trainer subclass,
  the entrypoint (``python -m deepanalyze_env.trainers.skyrl``) and the recipe launcher.

Adapters import the core; the core never imports them.
"""
