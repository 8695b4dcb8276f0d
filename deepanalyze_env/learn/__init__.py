"""The learning pipeline (``deepanalyze-rl learn PIPELINE``): stage by stage, with a before/after table.

Stages (each one is an ordinary command run in its own process, so a user can rerun any of them
by hand with the arguments saved in ``stages.json``, and a stage's memory is freed when it ends):

1. ``bank build`` of the pipeline's tables and families (skipped when the bank exists) and the
   train / dev / test task files: a seeded, family-stratified sample of each split, judge-free
   methods only unless ``env.judge`` is set;
2. ``eval`` of the starting model on the dev tasks (``eval-base/``);
3. ``rollout --policy scripted`` of the train tasks' reference trajectories through the env with
   the pipeline's env config (``reference/``): the SFT data, rendered as the trainers see episodes;
4. ``train`` of the SFT recipe on those records, or on ``sft.references`` of them (a seeded,
   family-stratified sample), (``sft/``, a model folder), then ``eval-sft/``;
5. with an ``rft`` section, rejection-sampling fine-tuning rounds from the current model: ``eval``
   sampling k episodes per train task (``rft/roundN/sample``), its correct episodes
   (``offline/correct.py``) and ``train`` of the SFT recipe on them (``rft/roundN/model``), then
   ``eval-rft/``;
6. ``train`` of the GRPO recipe from the current model (SFT, or RFT) on the train tasks
   (``grpo/``), then ``eval-grpo/``;
7. ``eval`` of the last model on the test tasks, once, when the pipeline has test tasks.

Why a command that chains commands rather than a recipe backend: every stage already exists as
a command with its own output folder, resume and report; chaining them keeps one implementation
of each, and ``stages.json`` makes the chain reproducible by hand.

Resume: a finished stage is recorded in ``stages.json`` with its arguments; rerunning the
pipeline reuses it when the arguments are unchanged, and reruns it and every later stage when
they differ (``--fresh`` reruns everything). Evals resume episode by episode. A stage is done only
when it is complete: an eval that wrote its report with no planned episode missing, a rollout
whose ``episodes.jsonl`` holds every planned episode. An incomplete one is tried once more at
once (``--resume`` when it left a run folder, else in a clean folder); if it is still incomplete
it is recorded as not done (``incomplete`` in ``stages.json``, so the next run resumes it), and
the pipeline goes on only when what it left is readable (an eval's report, which counts the
missing episodes as failures), else it stops with the stage named.

Where it sits: above ``trainers`` and ``offline`` (it reads a training recipe's settings and
chains the commands of both), below the CLI, whose ``learn`` command only parses its arguments
and calls :func:`run_pipeline`; nothing below imports it. Modules: ``settings`` (the pipeline
file), ``tasks`` (the bank slice and the split samples), ``commands`` (each stage's command as
typed settings, and the one place its argv is built), ``stages`` (running, reusing and resuming
commands), ``summary`` (``learn.json``, read from the stages' reports through their writers'
readers), ``run`` (the stages in order), ``outputs`` (table, markdown, plot).

Output: ``learn.json`` (per-stage dev metrics, stage seconds, paired comparisons, GRPO steps),
``learn.md`` (the before/after table) and ``learn.png`` (the curve).
"""

from __future__ import annotations

from deepanalyze_env.learn.outputs import (
    comparison_lines,
    markdown,
    memory_line,
    plot,
    rft_lines,
    table,
    warning_lines,
)
from deepanalyze_env.learn.run import run_pipeline
from deepanalyze_env.learn.settings import Pipeline
from deepanalyze_env.learn.stages import StageFailed, content_digest

__all__ = [
    "Pipeline",
    "StageFailed",
    "comparison_lines",
    "content_digest",
    "markdown",
    "memory_line",
    "plot",
    "rft_lines",
    "run_pipeline",
    "table",
    "warning_lines",
]
