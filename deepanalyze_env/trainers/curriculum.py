"""Success-rate curriculum: sample GRPO tasks whose groups are likely to have reward variance.

A GRPO group in which every sample succeeds (or every sample fails) has zero advantage and
teaches nothing. This module keeps a per-task success estimate from the groups it observes and
draws tasks with a weight that peaks for tasks neither mastered nor hopeless, with a floor so
that every task keeps being revisited (a task's estimate goes stale as the policy changes).

It is trainer-neutral plain Python: ``trainers/trl/curriculum_sampler.py`` turns it into a torch
``Sampler`` for ``GRPOTrainer``; the rollout feeds it each finished episode's outcome.

Estimator: a Beta posterior per task. ``prior`` = (alpha, beta) pseudo-counts; each observation
first multiplies the task's counts by ``decay`` (old evidence fades as the policy moves), then
adds one to alpha (success) or beta (failure). The estimate is the posterior mean
``alpha / (alpha + beta)``.

Success has one of two bases, and each step's metrics count which one judged its episodes
(``success_basis``). ``accuracy``: the task's plan has one of ``accuracy_components`` (the bank's
``answer_match`` / ``answer_parts_all``, the QA plan's ``qa_accuracy``) — known from the task's
``reward_spec`` when the trainer passes its rows (:func:`accuracy_tasks`), else from the episode's
components — and success means that component reached 1; an episode of such a task without the
component (a failed gate, a length cut) is a failure. ``reward``: the plan has none, and success
means ``reward > success_threshold`` (−0.5 reads "passed the format gate", whose failure is −1).
Accuracy is the signal GRPO is after; the gate is only the fallback where accuracy cannot be
measured. Episodes whose reward could not be computed (``verifier_error``,
``environment_error``) say nothing about the policy and are not counted; an episode cut for
length is a failure (the policy did not answer).

Weight: ``floor + (1 - floor) * (4 p (1 - p)) ** sharpness`` — 1 at p = 0.5, ``floor`` at 0 or 1.
Tasks are drawn without replacement within a batch with probability proportional to weight
(Efraimidis–Spirakis keys), from a ``random.Random(seed)``: the same seed and the same
observations give the same draws on every process.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, TypedDict, cast

from deepanalyze_env.core.contracts import EpisodeRecord, JsonValue
from deepanalyze_env.core.errors import ConfigError
from rewards import ACCURACY_COMPONENTS
from rewards.plan import spec_accuracy_component

NOT_COUNTED = ("verifier_error", "environment_error")
DEFAULT_ACCURACY = ACCURACY_COMPONENTS
HISTOGRAM_BINS = 10

SuccessBasis = Literal["accuracy", "reward"]
"""What judged an episode's success: its task's accuracy component, or (no accuracy component)
its reward against ``success_threshold``."""


class Outcome(TypedDict):
    """One finished episode, as the rollout reports it (a subset of the episode record)."""

    task_id: str
    reward: float | None
    reward_status: str
    termination: str | None
    reward_components: dict[str, float]


class CurriculumState(TypedDict):
    """``SuccessRateCurriculum.state_dict()``: what a checkpoint keeps."""

    task_ids: list[str]
    tasks: list[list[float]]  # per task: alpha, beta, episodes
    rng: tuple[object, ...]  # random.Random.getstate(); lists in place of tuples once saved


class CurriculumMetrics(TypedDict):
    """``SuccessRateCurriculum.drain()``: a step's curriculum figures (docs/design.md §11)."""

    groups: int
    zero_variance_groups: int
    zero_variance_fraction: float | None
    episodes_counted: int
    episodes_excluded: int
    success_basis: dict[str, int]  # SuccessBasis → episodes it judged this step
    success_histogram: list[int]
    mastered: int
    hopeless: int
    tasks: int
    sampling_entropy: float
    sampling_entropy_max: float


@dataclass
class CurriculumConfig:
    """The recipe's ``curriculum`` section (every field optional except ``kind``).

    kind: ``success_rate`` (the only curriculum so far).
    prior: Beta pseudo-counts (alpha, beta) of an unseen task; (1, 1) is uniform, mean 0.5, so
      unseen tasks start at the peak weight and are tried early.
    decay: factor in (0, 1] applied to a task's counts before each new observation (0.9); 1 keeps
      all evidence, 0.9 lets roughly the last ten episodes dominate, so a task the policy has
      since mastered stops looking like a middle task (benchmarks/curriculum.py: with decay 1
      the stale estimates cost about a third of the gain).
    floor: least weight of any task, in (0, 1] (0.05); relative to the peak weight 1.
    sharpness: exponent on 4p(1-p) (2); higher favours the middle band more strongly.
    success_threshold: reward above which an episode counts as a success when its plan has no
      accuracy component (the ``reward`` basis; −0.5 means "passed the format gate").
    accuracy_components: component names read as accuracy, first present wins; ``[]`` turns the
      accuracy basis off (every episode judged by ``success_threshold``).
    mastered: estimate at or above which a task is reported as mastered (logging only).
    hopeless: estimate at or below which a task is reported as hopeless (logging only).
    min_episodes: episodes a task needs before it can be reported mastered or hopeless.
    from_records: a run folder (or records file) whose episodes seed the estimates.
    seed: seed of the draws; None takes the trainer's seed.
    """

    kind: Literal["success_rate"] = "success_rate"
    prior: tuple[float, float] = (1.0, 1.0)
    decay: float = 0.9
    floor: float = 0.05
    sharpness: float = 2.0
    success_threshold: float = 0.5
    accuracy_components: tuple[str, ...] = DEFAULT_ACCURACY
    mastered: float = 0.9
    hopeless: float = 0.1
    min_episodes: int = 4
    from_records: str | None = None
    seed: int | None = None

    @classmethod
    def from_mapping(cls, tree: JsonValue, source: str = "") -> CurriculumConfig:
        """A recipe section → config; every bad key or value is a one-line ConfigError that starts
        with ``source`` (the recipe file) when given."""
        where = f"{source}: curriculum" if source else "curriculum"
        if not isinstance(tree, dict):
            raise ConfigError(f"{where} must be a mapping with kind: success_rate")
        known = [f.name for f in fields(cls)]
        bad = [k for k in tree if k not in known]
        if bad:
            prefix = f"{source}: " if source else ""
            raise ConfigError(f"{prefix}unknown key curriculum.{bad[0]} (known: {', '.join(known)})")
        if tree.get("kind") != "success_rate":
            raise ConfigError(f"{where}.kind must be success_rate, got {tree.get('kind')!r}")
        args = dict(tree)
        for name, value in tree.items():
            try:
                args[name] = _COERCE.get(name, lambda v: v)(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{where}.{name}: bad value {value!r} ({_EXPECTED.get(name, 'see the docs')})"
                )
        config = cls(**args)
        config.validate(where)
        return config

    def validate(self, where: str = "curriculum") -> None:
        checks = [
            (0 < self.decay <= 1, "decay must be in (0, 1]"),
            (0 < self.floor <= 1, "floor must be in (0, 1]"),
            (self.sharpness > 0, "sharpness must be > 0"),
            (0 <= self.hopeless < self.mastered <= 1, "need 0 <= hopeless < mastered <= 1"),
            (self.min_episodes >= 0, "min_episodes must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"{where}: {message}")


def _prior(value: JsonValue) -> tuple[float, float]:
    prior = tuple(float(x) for x in value)  # a bad value is a TypeError or ValueError
    if len(prior) != 2 or min(prior) <= 0:
        raise ValueError
    return prior[0], prior[1]


def _names(value: JsonValue) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple):
        raise TypeError
    return tuple(str(v) for v in value)


Coerce = Callable[[JsonValue], object]  # a recipe value → the field's type (TypeError/ValueError if bad)


def _optional(kind: Callable[[JsonValue], object]) -> Coerce:
    return lambda v: None if v is None else kind(v)


_COERCE: dict[str, Coerce] = {
    "prior": _prior,
    "accuracy_components": _names,
    **{n: float for n in ("decay", "floor", "sharpness", "success_threshold", "mastered", "hopeless")},
    "min_episodes": int,
    "seed": _optional(int),
    "from_records": _optional(str),
}
_EXPECTED = {
    "prior": "two positive numbers [alpha, beta]",
    "accuracy_components": "a component name or a list of them",
    "min_episodes": "an integer",
    "seed": "an integer",
}


@dataclass
class _Task:
    alpha: float
    beta: float
    episodes: int = 0


@dataclass
class StepLog:
    """What ``drain()`` returns: the curriculum's state and the groups seen since the last drain."""

    groups: int = 0
    zero_variance_groups: int = 0
    episodes_counted: int = 0
    episodes_excluded: int = 0
    basis: Counter[str] = field(default_factory=Counter)


def group_variance(rewards_by_task: Iterable[Sequence[float]]) -> tuple[int, int]:
    """``(groups, zero_variance_groups)`` over the trained rewards of one rollout call, grouped by
    task: a group counts once it has two trained rewards, and has zero variance when they are all
    equal (GRPO's advantage is then 0 for every member). The one definition, read by the
    curriculum's log and by the per-step report of both trainers."""
    groups = zero = 0
    for rewards in rewards_by_task:
        if len(rewards) < 2:
            continue
        groups += 1
        if max(rewards) - min(rewards) <= 1e-9:
            zero += 1
    return groups, zero


def accuracy_tasks(rows: Iterable[Mapping[str, object]], config: CurriculumConfig) -> set[str]:
    """The ids of the rows whose plan (``reward_spec``) has one of ``config.accuracy_components``:
    their episodes are judged on accuracy even when one carries no accuracy component."""
    names = set(config.accuracy_components)
    out = set()
    for row in rows:
        spec = row.get("reward_spec")
        if isinstance(spec, str):  # a JSON string column (core/tasks.py)
            try:
                spec = json.loads(spec)
            except ValueError:
                continue
        if isinstance(spec, Mapping) and spec_accuracy_component(spec) in names:
            out.add(str(row["task_id"]))
    return out


def judge(
    outcome: Outcome, config: CurriculumConfig, accuracy_task: bool = False
) -> tuple[bool, SuccessBasis] | None:
    """Success and its basis for a counted episode, None for one that says nothing about the
    policy. ``accuracy_task``: the task's plan is known to have an accuracy component."""
    if outcome["reward_status"] in NOT_COUNTED:
        return None
    components = outcome.get("reward_components") or {}
    for name in config.accuracy_components:
        if name in components and components[name] is not None:
            return float(components[name]) >= 1.0 - 1e-9, "accuracy"
    if accuracy_task and config.accuracy_components:
        return False, "accuracy"  # no answer to check (failed gate, length cut): not accurate
    reward = outcome.get("reward")
    if reward is None or (isinstance(reward, float) and math.isnan(reward)):
        return False, "reward"  # scored but untrained (cut for length): the policy did not succeed
    return float(reward) > config.success_threshold, "reward"


def success_of(outcome: Outcome, config: CurriculumConfig, accuracy_task: bool = False) -> bool | None:
    """True/False for a counted episode, None for one that says nothing about the policy."""
    judged = judge(outcome, config, accuracy_task)
    return None if judged is None else judged[0]


class SuccessRateCurriculum:
    """Per-task Beta estimates, weights and weighted draws over a fixed task list."""

    def __init__(
        self,
        task_ids: Sequence[str],
        config: CurriculumConfig | None = None,
        seed: int = 0,
        accuracy: Collection[str] = (),
    ):
        self.config = config or CurriculumConfig()
        self.accuracy = frozenset(str(t) for t in accuracy)  # tasks judged on accuracy (accuracy_tasks)
        self.config.validate()
        self.task_ids = [str(t) for t in task_ids]
        if len(set(self.task_ids)) != len(self.task_ids):
            raise ValueError("curriculum task ids must be unique")
        self.index = {t: i for i, t in enumerate(self.task_ids)}
        a, b = self.config.prior
        self.tasks = [_Task(a, b) for _ in self.task_ids]
        self.rng = random.Random(self.config.seed if self.config.seed is not None else seed)
        self._log = StepLog()

    # -- evidence

    def observe(self, outcomes: Iterable[Outcome]) -> None:
        """Fold in finished episodes. Episodes of one call that share a task are one group (for
        the zero-variance count, on the rewards GRPO trains on); unknown tasks are ignored."""
        groups: dict[str, list[float]] = defaultdict(list)
        for outcome in outcomes:
            i = self.index.get(str(outcome["task_id"]))
            if i is None:
                continue
            judged = judge(outcome, self.config, self.task_ids[i] in self.accuracy)
            if judged is None:
                self._log.episodes_excluded += 1
                continue
            success, basis = judged
            self._log.episodes_counted += 1
            self._log.basis[basis] += 1
            self._update(i, success)
            if outcome.get("reward") is not None:
                groups[self.task_ids[i]].append(float(outcome["reward"]))
        counted, zero = group_variance(groups.values())
        self._log.groups += counted
        self._log.zero_variance_groups += zero

    def _update(self, i: int, success: bool) -> None:
        task = self.tasks[i]
        task.alpha = task.alpha * self.config.decay + float(success)
        task.beta = task.beta * self.config.decay + float(not success)
        task.episodes += 1

    def observe_records(self, records: Iterable[EpisodeRecord]) -> int:
        """Seed from earlier episode records (unfinished ones skipped); returns how many counted."""
        before = self._log.episodes_counted
        finished = [r for r in records if r.get("reward_status") not in (None, "unfinished")]
        self.observe(cast(list[Outcome], finished))  # a record holds every field of an Outcome
        counted = self._log.episodes_counted - before
        self._log = StepLog()  # history is not this run's first step
        return counted

    @classmethod
    def from_records(
        cls,
        run_dir: str | Path,
        task_ids: Sequence[str],
        config: CurriculumConfig | None = None,
        seed: int = 0,
        accuracy: Collection[str] = (),
    ) -> SuccessRateCurriculum:
        from deepanalyze_env.core.records import load_run

        curriculum = cls(task_ids, config, seed, accuracy)
        try:
            run = load_run(run_dir)
        except FileNotFoundError as exc:
            raise ConfigError(f"curriculum.from_records: {exc}")
        curriculum.observe_records(run.records)
        return curriculum

    # -- checkpoints

    def state_dict(self) -> CurriculumState:
        """Estimates and the draw generator's state, so a resumed run draws as the first would have
        (SkyRL saves it with its dataloader checkpoint)."""
        return {
            "task_ids": list(self.task_ids),
            "tasks": [[t.alpha, t.beta, t.episodes] for t in self.tasks],
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: CurriculumState) -> None:
        """Restore a ``state_dict``; tasks are matched by id (tasks new to this run keep the prior,
        tasks gone from it are dropped), so a resumed run may change its data a little."""
        saved = dict(zip(state["task_ids"], state["tasks"], strict=True))
        for task_id, task in zip(self.task_ids, self.tasks, strict=True):
            if task_id in saved:
                task.alpha, task.beta, task.episodes = (
                    float(saved[task_id][0]),
                    float(saved[task_id][1]),
                    int(saved[task_id][2]),
                )
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))

    # -- estimates and weights

    def estimate(self, task_id: str) -> float:
        task = self.tasks[self.index[task_id]]
        return task.alpha / (task.alpha + task.beta)

    def estimates(self) -> list[float]:
        return [t.alpha / (t.alpha + t.beta) for t in self.tasks]

    def weight_of(self, p: float) -> float:
        floor = self.config.floor
        return floor + (1.0 - floor) * (4.0 * p * (1.0 - p)) ** self.config.sharpness

    def weights(self) -> list[float]:
        return [self.weight_of(p) for p in self.estimates()]

    def probabilities(self) -> list[float]:
        weights = self.weights()
        total = sum(weights)
        return [w / total for w in weights]

    # -- draws

    def draw(self, k: int) -> list[int]:
        """``k`` task indices: distinct while ``k`` <= the number of tasks, by weight."""
        weights = self.weights()
        out: list[int] = []
        while len(out) < k:
            n = min(k - len(out), len(weights))
            keys = [(self.rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)]
            keys.sort(reverse=True)
            out.extend(i for _, i in keys[:n])
        return out

    # -- logging

    def drain(self) -> CurriculumMetrics:
        """Per-step metrics (for ``metrics.jsonl``), and a fresh group count for the next step."""
        log, self._log = self._log, StepLog()
        estimates = self.estimates()
        probs = self.probabilities()
        enough = self.config.min_episodes
        judged = [p for p, t in zip(estimates, self.tasks, strict=True) if t.episodes >= enough]
        hist = Counter(min(int(p * HISTOGRAM_BINS), HISTOGRAM_BINS - 1) for p in estimates)
        entropy = -sum(p * math.log(p) for p in probs if p > 0)
        return {
            "groups": log.groups,
            "zero_variance_groups": log.zero_variance_groups,
            "zero_variance_fraction": (log.zero_variance_groups / log.groups) if log.groups else None,
            "episodes_counted": log.episodes_counted,
            "episodes_excluded": log.episodes_excluded,
            "success_basis": {b: log.basis.get(b, 0) for b in ("accuracy", "reward")},
            "success_histogram": [hist.get(b, 0) for b in range(HISTOGRAM_BINS)],
            "mastered": sum(1 for p in judged if p >= self.config.mastered),
            "hopeless": sum(1 for p in judged if p <= self.config.hopeless),
            "tasks": len(self.tasks),
            "sampling_entropy": entropy,
            "sampling_entropy_max": math.log(len(probs)) if probs else 0.0,
        }
