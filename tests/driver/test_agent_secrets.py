"""Agent credentials come from the host's environment, reach only the agent that needs them,
and a host without them refuses the run up front, naming the variable (never a value)."""
from __future__ import annotations

import pytest

from baton.errors import InvalidArgument
from sandbox_host.agents import prepare_agent
from sandbox_host.deps import HostDeps, HostSettings

ENV = {"ANTHROPIC_API_KEY": "sk-ant-secret-value", "OPENAI_API_KEY": "sk-openai-secret", "HOME": "/root",
       "BATON_PROVIDER": "local"}


def _deps(env: dict[str, str]) -> HostDeps:
    return HostDeps(host_id="h", cc=None, session=None, log=None, transcripts=None, providers={},
                    settings=HostSettings.from_env(env))


def test_host_settings_keep_only_agent_credentials_and_hide_them_from_repr() -> None:
    settings = HostSettings.from_env(ENV)
    assert dict(settings.secrets) == {"ANTHROPIC_API_KEY": "sk-ant-secret-value", "OPENAI_API_KEY": "sk-openai-secret"}
    assert "sk-ant-secret-value" not in repr(settings)


def test_each_agent_gets_only_its_own_credential() -> None:
    deps = _deps(ENV)
    claude = prepare_agent("claude-code", {}, prompt="hi")
    codex = prepare_agent("codex", {}, prompt="hi")
    assert deps.agent_secrets(claude) == {"ANTHROPIC_API_KEY": "sk-ant-secret-value"}
    assert deps.agent_secrets(codex) == {"OPENAI_API_KEY": "sk-openai-secret"}


def test_a_host_without_the_credential_refuses_naming_the_variable_not_a_value() -> None:
    deps = _deps({"OPENAI_API_KEY": "sk-openai-secret"})
    with pytest.raises(InvalidArgument) as refused:
        deps.agent_secrets(prepare_agent("claude-code", {}, prompt="hi"))
    assert refused.value.field == "agent.kind"
    assert "ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN" in refused.value.problem
    assert "sk-" not in str(refused.value)
