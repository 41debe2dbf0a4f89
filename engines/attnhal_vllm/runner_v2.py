"""The vLLM plugin's wrappers for the V2 model runner (``v1/worker/gpu/``): vLLM 0.33's default, 0.34's only.

0.34 removed the V1 runner whose mode check the plugin wraps on 0.33 (beside these). The V2 runner takes
the weakest builder level over its attention groups (``attn_utils.get_attn_cg_support``,
322-347), resolves the mode with ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
(``model_runner.py:792``; config/compilation.py:1535) and hands it to the drafter, which
captures its draft decodes FULL_DECODE_ONLY or not at all ("PIECEWISE cudagraphs are not
supported for draft decodes", ``spec_decode/autoregressive/speculator.py:36-52``).

The wrappers log what vLLM decided, the same audit lines as on 0.33
(:func:`~attnhal_vllm.audit.audit_mode`), and never change a decision; an error of
theirs is logged and vLLM's result stands. Imported only inside vLLM, by the plugin.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["drafter_audited", "groups_recorded", "resolution_audited"]

log = logging.getLogger("vllm.attnhal")
#: The release the plugin models (set by the plugin before it wraps): the drafter lines name it.
RELEASE = ["0.34.0"]
#: The attention groups' levels the last ``get_attn_cg_support`` saw, for the resolution that follows
#: it in the same runner (``model_runner.py:724-799``): a list of audit.GroupLevel.
_last_groups: list[Any] = []


def _enum_names() -> dict[str, str]:
    """Backend class name -> vLLM's backend name (``FlashInferBackend`` -> ``FLASHINFER``): the
    V2 runner names the weakest backend by its class (``attn_utils.py:343``)."""
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:  # not inside vLLM: class names stand
        return {}
    return {str(member.value).rsplit(".", 1)[-1]: member.name for member in AttentionBackendEnum
            if isinstance(member.value, str) and member.value}


def groups_recorded(original: Callable[..., Any]) -> Callable[..., Any]:
    """Around ``get_attn_cg_support(attn_groups, vllm_config, checked_layer_names)``: remember each
    group's backend and level (the builders' own answers) for the resolution's log lines."""
    @functools.wraps(original)
    def wrapper(attn_groups: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(attn_groups, vllm_config, *args, **kwargs)
        try:
            _last_groups[:] = _levels(attn_groups, vllm_config)
        except Exception:
            _last_groups.clear()
            log.exception("attnhal: reading vLLM's attention groups failed; the audit names the weakest only")
        return result

    return wrapper


def _levels(attn_groups: Any, vllm_config: Any) -> list[Any]:
    from attnhal_vllm.audit import GroupLevel
    from attnhal_vllm.modes import CGSupport

    names, out = _enum_names(), []
    for index, groups in enumerate(attn_groups):
        for group in groups:
            level = group.get_metadata_builder(0).get_cudagraph_support(vllm_config, group.kv_cache_spec)
            backend = group.backend.__name__
            out.append(GroupLevel(index, names.get(backend, backend), CGSupport[level.name],
                                  type(group.kv_cache_spec).__name__))
    return out


def resolution_audited(original: Callable[..., Any]) -> Callable[..., Any]:
    """Around ``CompilationConfig.resolve_cudagraph_mode_and_sizes``: log the audit of the mode."""
    @functools.wraps(original)
    def wrapper(self: Any, min_cg_support: Any, min_cg_attn_backend: str | None, uniform_decode_query_len: int = 1,
                *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_v2_model_runner") is False:  # vLLM 0.33's V1 runner: its own wrapper reports
            return original(self, min_cg_support, min_cg_attn_backend, uniform_decode_query_len, *args, **kwargs)
        requested = self.cudagraph_mode
        try:
            result = original(self, min_cg_support, min_cg_attn_backend, uniform_decode_query_len, *args, **kwargs)
        except ValueError as exc:  # vLLM refuses the mode: explain it, then let vLLM raise
            _report(self, requested, min_cg_support, min_cg_attn_backend, uniform_decode_query_len, None, str(exc),
                    kwargs)
            raise
        _report(self, requested, min_cg_support, min_cg_attn_backend, uniform_decode_query_len, result, None, kwargs)
        return result

    return wrapper


def _groups(min_cg_support: Any, min_cg_attn_backend: str | None) -> list[Any]:
    """The recorded groups when they are this resolution's (their minimum is the one passed);
    otherwise the one group vLLM names."""
    from attnhal_vllm.audit import GroupLevel
    from attnhal_vllm.modes import CGSupport, min_support

    level = CGSupport[min_cg_support.name]
    if _last_groups and min_support({f"{g.backend}{i}": g.level for i, g in enumerate(_last_groups)})[0] is level:
        return list(_last_groups)
    if min_cg_attn_backend is None:
        return []
    return [GroupLevel(0, _enum_names().get(min_cg_attn_backend, min_cg_attn_backend), level)]


def _report(config: Any, requested: Any, min_cg_support: Any, min_cg_attn_backend: str | None, query_len: int,
            resolved: Any, error: str | None, kwargs: dict[str, Any]) -> None:
    from attnhal.engines.report import StrictRefusal
    from attnhal_vllm.startup import at_start

    try:
        from attnhal_vllm.audit import audit_mode
        from attnhal_vllm.modes import GraphMode
        from attnhal.platform import detect

        groups = _groups(min_cg_support, min_cg_attn_backend)
        asked = GraphMode(requested.name if requested is not None else "NONE")
        mode = None if error else GraphMode(resolved.name)
        split = bool(config.splitting_ops_contain_attention())
        platform = detect()  # ATTNHAL_PLATFORM overrides
        result = audit_mode(groups, asked, mode, query_len, split, error, platform)
        for line in result.lines:
            log.info("attnhal: %s", line)
        sizes = tuple(getattr(config, "cudagraph_capture_sizes", None) or ())
        at_start(groups, asked, mode, query_len, split, sizes, error, platform)
        if not kwargs.get("piecewise_capture_available", True):
            log.info("attnhal: the model has neither a compiled submodule nor breakable CUDA graphs: vLLM "
                     "drops the piecewise part of the mode (config/compilation.py:1631-1643)")
    except StrictRefusal:
        raise
    except Exception:
        log.exception("attnhal: explaining vLLM's cudagraph_mode failed; vLLM's resolution stands")


def drafter_audited(original: Callable[..., Any]) -> Callable[..., Any]:
    """Around the V2 drafter's ``init_cudagraph_manager(cudagraph_mode)`` (0.34: ``AutoRegressiveSpeculator``'s,
    0.33: ``TargetDependentARSpeculator``'s): log the drafter's modes, then its graph-report table
    (:func:`~attnhal_vllm.startup.at_drafter`; draft decodes where it takes more than one step)."""
    @functools.wraps(original)
    def wrapper(self: Any, cudagraph_mode: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, cudagraph_mode, *args, **kwargs)
        try:
            from attnhal_vllm.drafter import drafter_line, observed
            from attnhal_vllm.modes import GraphMode

            from attnhal_vllm.startup import at_drafter

            target = GraphMode(cudagraph_mode.name)
            seen = observed(RELEASE[0], target, _mode_of(self, "decode_cudagraph_manager"))
            log.info("attnhal: %s", drafter_line(type(self).__name__, seen,
                                                 _mode_of(self, "prefill_cudagraph_manager")))
            at_drafter(seen, target, (getattr(self, "num_speculative_steps", None) or 2) > 1)
        except Exception:
            log.exception("attnhal: explaining the drafter's cudagraph mode failed; vLLM's decision stands")
        return result

    return wrapper


def _mode_of(speculator: Any, attr: str) -> str | None:
    manager = getattr(speculator, attr, None)
    mode = getattr(manager, "cudagraph_mode", None)
    return None if mode is None else str(mode.name)
