"""A typed OpenEnv client for the served env (``serve --transport openenv``): OpenEnv's own
``EnvClient`` over its WebSocket protocol, with this env's action, observation and state.

Example::

    from deepanalyze_env.serve.openenv_client import DeepAnalyzeEnvClient
    from deepanalyze_env.serve.openenv_server import DeepAnalyzeAction

    # the base URL ``serve --transport openenv`` prints (its WebSocket is /ws under it)
    with DeepAnalyzeEnvClient(base_url="http://127.0.0.1:8766").sync() as env:
        first = env.reset(task_id="qa-retail-001")
        out = env.step(DeepAnalyzeAction(tool="run_python", arguments={"code": "print(1)"}))
        end = env.step(DeepAnalyzeAction(tool="submit_answer", arguments={"answer": "42"}))
        print(end.reward, end.observation.reward_components)
"""

from __future__ import annotations

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.serve.openenv_server import DeepAnalyzeAction, DeepAnalyzeObservation, DeepAnalyzeState


class DeepAnalyzeEnvClient(EnvClient[DeepAnalyzeAction, DeepAnalyzeObservation, DeepAnalyzeState]):
    """OpenEnv's async ``EnvClient`` typed for this env (``.sync()`` for blocking calls): how the
    trainers' OpenEnv integrations, or a user's loop, reach a ``serve --transport openenv``."""

    def _step_payload(self, action: DeepAnalyzeAction) -> JsonObject:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: JsonObject) -> StepResult[DeepAnalyzeObservation]:
        observation = DeepAnalyzeObservation(
            **payload.get("observation", {}), done=payload.get("done", False), reward=payload.get("reward")
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: JsonObject) -> DeepAnalyzeState:
        return DeepAnalyzeState(**payload)
