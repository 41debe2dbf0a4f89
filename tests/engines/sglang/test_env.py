"""attnhal reads SGLang's environment variables as SGLang 0.5.23 does: ``resolution.env_bool``
against SGLang's own ``envs.<NAME>.get()`` (``EnvBool``) over many strings, for every variable
of ``resolution.BOOL_ENV``; and the rule it replaced (true/1 only) shown wrong for ``yes``.
"""

from __future__ import annotations

import warnings

from hypothesis import given, settings, strategies as st
import pytest

from attnhal_sglang import config as resolution

#: Spellings near SGLang's sets: case, padding, empty, other words engines accept.
STRINGS = ("", " ", "1", "0", "true", "false", "True", "FALSE", "TRUE", "yes", "no", "YES", "Yes", "y", "Y", "n",
           "N", "on", "off", "ON", "t", "f", "2", "-1", "01", "1.0", " 1", "1 ", "true ", "yes\n", "none", "None",
           "enable", "disabled", "ye", "nO", "tRuE", "\t0")


def _sglang_reads(monkeypatch: pytest.MonkeyPatch, name: str, raw: str | None) -> bool:
    from sglang.srt.environ import envs

    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang warns about an invalid value, then takes the default
        return bool(getattr(envs, name).get())


@pytest.mark.parametrize("name", sorted(resolution.BOOL_ENV))
def test_env_bool_reads_what_sglang_reads(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from sglang.srt.environ import EnvBool, envs

    assert isinstance(getattr(envs, name), EnvBool)  # the rule env_bool implements
    for raw in (None, *STRINGS):
        env = {} if raw is None else {name: raw}
        assert resolution.env_bool(env, name) is _sglang_reads(monkeypatch, name, raw), raw


@settings(max_examples=200, deadline=None)
@given(raw=st.text(alphabet="01tTrRuUeEyYnNoOfFaAlLsS \t", max_size=6))
def test_env_bool_agrees_on_random_strings(raw: str) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in resolution.BOOL_ENV:
            assert resolution.env_bool({name: raw}, name) is _sglang_reads(monkeypatch, name, raw), raw


def test_sglang_get_bool_env_var_is_another_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's older ``get_bool_env_var`` (true/1 only) is not what the variables attnhal reads
    go through: it calls ``yes`` false, where ``EnvBool`` (and the draft worker) call it true."""
    from sglang.srt.utils.common import get_bool_env_var

    name = resolution.DRAFT_EXTEND_GRAPH_OFF
    monkeypatch.setenv(name, "yes")
    assert not get_bool_env_var(name) and _sglang_reads(monkeypatch, name, "yes")
    assert resolution.env_bool({name: "yes"}, name)
