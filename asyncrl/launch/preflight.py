"""Pre-flight checks of the model and tokenizer folders: what would otherwise fail inside a trainer rank or a
rollout replica, after Ray and the workers started, fails here in about a second with one line naming the key.

    model_config, tokenizer = check_model_inputs(config)   # raises ConfigError; build_runtime runs it before Ray

Checked: the policy folder (config.json, architecture, weight files, tensor names and shapes, read from the
safetensors headers only), the critic's folder when it has its own, and that the tokenizer belongs to the model
(`check_tokenizer_fits_model`), the servers of rollout.backend=external (`check_external_servers`: each answers
/health and lists a model), and the tools of a multi-turn run (`check_tools`: built once here, so a user tool
that fails to import or a python tool whose OS sandbox cannot start is named before Ray). Datasets, prompt
lengths and the reward function are checked next, by `load_inputs`, also before Ray starts.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import AsyncRLConfig, ConfigError, needs_critic
from asyncrl.models import TransformerConfig, check_model_folder, check_tokenizer_fits_model, load_tokenizer
from asyncrl.rollout.external_client import ServerClient, ServerFailure, ServerRequestError, api_key_of
from asyncrl.rollout.tools import ToolConfigError, load_tools

SERVER_PROBE_S = 10.0   # a live server answers /health and /v1/models at once


def check_model_inputs(config: AsyncRLConfig) -> tuple[TransformerConfig, Any]:
    """The policy's config and the tokenizer, both checked."""
    if not config.model.path:
        raise ConfigError("model.path is empty: set it to an HF model folder (config.json, safetensors, tokenizer)")
    model_config = check_folder("model.path", config.model.path, "causal_lm")
    if needs_critic(config) and config.critic.model_path:
        check_folder("critic.model_path", config.critic.model_path, "value")
    tokenizer_key = "model.tokenizer_path" if config.model.tokenizer_path else "model.path"
    tokenizer_path = config.model.tokenizer_path or config.model.path
    try:
        tokenizer = load_tokenizer(tokenizer_path)
        check_tokenizer_fits_model(tokenizer, tokenizer_path, model_config, config.model.path)
    except ValueError as error:
        raise ConfigError(f"{tokenizer_key}: {error}") from None
    return model_config, tokenizer


def check_folder(key: str, folder: str, kind: str) -> TransformerConfig:
    try:
        return check_model_folder(folder, kind)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def check_tools(config: AsyncRLConfig) -> None:
    if not config.rollout.multi_turn.enable:
        return
    try:
        load_tools(config.rollout.multi_turn.tool_config_path)
    except ToolConfigError as error:
        raise ConfigError(str(error)) from None


def check_external_servers(config: AsyncRLConfig) -> None:
    settings = config.rollout.external
    if config.rollout.backend != "external":
        return
    for url in settings.urls:
        try:
            ServerClient(url, api_key_of(settings.api_key_env), min(settings.timeout_s, SERVER_PROBE_S)).connect()
        except (ServerFailure, ServerRequestError) as error:
            raise ConfigError(f"rollout.external.urls: {error}") from None
