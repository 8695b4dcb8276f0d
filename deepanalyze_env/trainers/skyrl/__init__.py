"""SkyRL adapter: ``python -m deepanalyze_env.trainers.skyrl [key=value …]``.

Nothing here is imported by the rest of the package: ``skyrl`` needs Python ≥ 3.12 and is an
optional extra, so only the modules below import it, and only when the entrypoint runs.

- ``config``: SkyRL's strict config tree extended with our env section and run options.
- ``advantage``: the ``deepanalyze_grpo`` estimator (rows with an empty mask neither train nor
  set their group's baseline).
- ``trainer``: the trainer subclass that turns env statuses into those empty masks (and runs the
  curriculum through SkyRL's train-dataloader hook).
- ``curriculum``: the success-rate curriculum as SkyRL's train batch sampler, fed by the generator.
- ``entrypoint``: the experiment, the Ray task that registers everything, and ``main``.
"""

from __future__ import annotations

INSTALL_HINT = (
    "SkyRL is not installed in this interpreter: it needs Python >= 3.12. Make a 3.12 venv and run "
    '`pip install "torch==2.13.0" && pip install -e ".[skyrl,kernel]"` there (GPU nodes: also '
    '`pip install "skyrl[fsdp]==0.4.0"`), then run this command with that venv\'s python.'
)


def skyrl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("skyrl") is not None
