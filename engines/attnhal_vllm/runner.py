"""The model runner vLLM selects, by vLLM's own rule for each release: V1 or V2.

The runner decides how the drafter's graphs are set up (:mod:`~attnhal_vllm.drafter`), so it is
part of the model. vLLM 0.33.0 has both runners and picks with ``VllmConfig.use_v2_model_runner``
(``config/vllm.py:731-767``): the environment variable ``VLLM_USE_V2_MODEL_RUNNER`` decides where
it is set (``int`` of it as a bool, ``envs.py:360-363``; another value makes vLLM raise); else V1
where Triton cannot be imported on a real platform, or where a feature V2 lacks is asked
(``_get_v2_model_runner_unsupported_features``, ``config/vllm.py:3053-3087``: speculative methods
``suffix`` / ``custom_class``, parallel drafting, heterogeneous draft vocabularies, DBO micro-batching,
pipeline parallelism under ``external_launcher`` — none of which attnhal's flags reach: each such
flag is refused as not modelled); else V2, the default on a GPU machine. vLLM 0.34.0 has only the
V2 runner (``v1/worker/gpu/``).

attnhal cannot see whether Triton imports where vLLM will run: V2 on 0.33 rests on it, and the
result says so (``assumes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnhal.engines.flags import EngineArgError

__all__ = ["ENV_VAR", "RunnerChoice", "select_runner"]

#: vLLM's switch between its model runners (read by vLLM 0.33 only).
ENV_VAR = "VLLM_USE_V2_MODEL_RUNNER"
_V2_ONLY = ("0.34.0",)


@dataclass(frozen=True)
class RunnerChoice:
    """``V1`` or ``V2``, why vLLM picks it, and what the choice rests on ("": nothing assumed)."""

    name: str
    why: str
    assumes: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"runner": self.name, "why": self.why, "assumes": self.assumes}


def _env_flag(value: str) -> bool:
    """``VLLM_USE_V2_MODEL_RUNNER`` as vLLM reads it (``bool(int(value))``); another value: refused,
    as vLLM refuses it."""
    try:
        return bool(int(value))
    except ValueError:
        raise EngineArgError(ENV_VAR, f"{ENV_VAR}={value!r} (supported: an integer, as vLLM reads it: 0 for the "
                                      "V1 model runner, 1 for V2)") from None


def select_runner(release: str, env: Mapping[str, str]) -> RunnerChoice:
    """The runner vLLM ``release`` selects with ``env`` (its process environment)."""
    if release in _V2_ONLY:
        return RunnerChoice("V2", f"vLLM {release} has only the V2 model runner (v1/worker/gpu/)")
    value = env.get(ENV_VAR)
    if value is not None:
        v2 = _env_flag(value)
        return RunnerChoice("V2" if v2 else "V1", f"{ENV_VAR}={value} (config/vllm.py:748-750)")
    return RunnerChoice("V2", f"vLLM {release}'s default on a GPU machine with Triton, {ENV_VAR} unset "
                              "(config/vllm.py:731-767)",
                        "Triton imports where vLLM runs (else vLLM 0.33 takes the V1 runner; "
                        f"{ENV_VAR}=0 picks V1 explicitly)")
