"""Offline tools around the env: collecting, filtering, scoring and inspecting episodes.

- ``rollout``/``policies``: run tasks with a policy (scripted, OpenAI-compatible, transformers).
- ``rundir``: a run folder (per-episode records, resume, consolidation).
- ``filters``: the ``--keep`` expression language over records.
- ``stats``, ``rescore``: summaries of a run; re-scoring judge components after an outage.
- ``judge_eval/``: checking a judge prompt offline against fixture answers.

Offline tools import the core and ``rewards``; the core and the trainers never import them.
"""
