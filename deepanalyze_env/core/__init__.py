"""The environment core: what a trainer needs to run one episode, and nothing else.

- ``env``: :class:`DeepAnalyzeEnv`, the skyrl_gym ``BaseTextEnv`` (init → step … → close).
- ``protocol``: the tag protocol (parsing turns, the stop tags, observations).
- ``formats``: the action formats (``tags``, ``tools``) by name; the env delegates every
  per-format rule to them (reading a turn, the gate, observations, the end of an episode).
- ``config``: ``env_config`` as strict dataclasses (``EnvConfig``, ``ExecutorConfig``, ``JudgeConfig``).
- ``errors``: ``ConfigError``, the one exception type for bad input.
- ``profiles``: ``v1`` and ``upstream`` semantics.
- ``tasks``: task files and dataset rows (JSONL, JSON, Parquet) → the env's ``extras``.
- ``records``: the episode record written on ``close()``.

Layer rule (``tests/test_layers.py``): nothing here imports ``generation``, ``trainers``, ``offline``
or ``cli``, nor torch, transformers or TRL (local models and generation live in ``generation``).
"""
