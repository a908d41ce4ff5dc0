"""Model specs → models: which provider, which endpoint, which credential.

A spec is ``scripted:PATH``, ``anthropic:MODEL`` or ``openai:MODEL``. An agent may give its model
an endpoint (``base_url``) and the variable holding its key (``api_key_env``); the host's
inference routes use each provider's own. The credential rule
(:func:`actors.config.key_variable`):

* ``api_key_env`` set: the key is read from that variable, whatever the endpoint;
* ``base_url`` set without ``api_key_env``: no key is read or sent (a local server needs none),
  so a provider's default variable never goes to an endpoint the operator configured;
* neither: the provider's default variable (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``) and its
  default endpoint, which the environment may point elsewhere with ``ANTHROPIC_BASE_URL`` or
  ``OPENAI_BASE_URL`` (set beside the key, as the providers' own tools read them).

Provider modules are imported only when a spec names them, so a host of scripted agents never
loads an HTTP client.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from actors.config import PROVIDER_KEYS, key_variable
from actors.errors import ConfigError

from .scripted import ScriptedModel

if TYPE_CHECKING:
    from actors.config import AgentConfig

    from .base import Model

#: The variable that moves each hosted provider's default endpoint.
BASE_URL_VARIABLES = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}


def make_model(cfg: AgentConfig) -> Model:
    return model_from_spec(
        cfg.model,
        f"agents[{cfg.name}].model",
        base_url=cfg.base_url,
        api_key_env=cfg.api_key_env,
    )


def model_from_spec(
    spec: str,
    where: str = "model",
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
) -> Model:
    kind, _, rest = spec.partition(":")
    if kind == "scripted":
        return ScriptedModel(Path(rest))
    if kind not in PROVIDER_KEYS:
        raise ConfigError(f"{where}: unknown provider {kind!r}")
    variable = key_variable(kind, base_url, api_key_env)
    endpoint = (
        base_url if base_url is not None else os.environ.get(BASE_URL_VARIABLES[kind]) or None
    )
    if kind == "anthropic":
        from .anthropic import AnthropicModel

        return AnthropicModel(
            rest, base_url=endpoint, key_variable=variable, env_headers=base_url is None
        )
    from .openai import OpenAIModel

    return OpenAIModel(rest, base_url=endpoint, key_variable=variable)
