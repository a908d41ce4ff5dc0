"""Server-initiated inference (SPEC §11) and ``model/info`` (§12): which model answers a server.

A server's ``inference/request`` is routed by (server, feature set): the server's
``inference_models`` (an exact feature-set name first, then the first matching pattern), else the
host's ``inference_model``. Nothing configured means the request is refused: a server never
spends an agent's model budget unless the operator said so. Each server also has a budget of
requests per hour (``inference_requests_per_hour``), a sliding window that refuses past its cap.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping

from actors.config import HostConfig
from actors.models.base import Model, ModelError, ModelRequest
from protocol.errors import INTERNAL_ERROR, RpcError
from protocol.hooks import ModelInfo
from protocol.inference import (
    InferenceRequest,
    RequestBudget,
    chunk_params,
    finish_reason,
    inference_result,
)

#: Tokens an answer may take when the request names no ``maxTokens``.
DEFAULT_MAX_TOKENS = 1024

Notify = Callable[[str, Mapping[str, object]], Awaitable[None]]


class InferenceRouter:
    """Shared by every connection: the routed models (one per configured spec) and each
    server's budget (one per configured server)."""

    def __init__(
        self,
        config: HostConfig,
        agent_models: Mapping[str, Model],
        make: Callable[[str], Model],
    ) -> None:
        self._config = config
        self._agent_models = dict(agent_models)
        self._make = make
        self._models: dict[str, Model] = {}  # at most one per spec in the config
        self._budgets = {s.id: RequestBudget(s.inference_requests_per_hour) for s in config.servers}

    def route(self, server_id: str, feature_set: str) -> Model | None:
        server = self._config.server(server_id)
        spec = server.inference_model_for(feature_set) if server is not None else None
        spec = spec or self._config.inference_model
        if spec is None:
            return None
        model = self._models.get(spec)
        if model is None:
            model = self._models[spec] = self._make(spec)
        return model

    def model_info(self, server_id: str) -> ModelInfo | None:
        """What ``model/info`` answers this server: the model of the first agent that hears it,
        else the model its inference requests are routed to."""
        for agent in self._config.agents:
            if agent.hears(server_id) and agent.name in self._agent_models:
                return self._agent_models[agent.name].info
        model = self.route(server_id, "*")
        return model.info if model is not None else None

    def take_budget(self, server_id: str, now: float) -> None:
        """Count one request against the server's hourly budget, or refuse it."""
        budget = self._budgets.get(server_id)
        if budget is None:
            raise RpcError(code=INTERNAL_ERROR, message=f"unknown server {server_id!r}")
        wait = budget.take(now)
        if wait is not None:
            retry = math.ceil(wait) if math.isfinite(wait) else None
            per_hour = budget.per_hour
            raise RpcError(
                code=INTERNAL_ERROR,
                message=f"inference budget spent ({per_hour} requests per hour)"
                + (f"; retry in {retry} s" if retry is not None else ""),
                data={"reason": "budget", "retryAfterSeconds": retry},
            )

    async def answer(
        self,
        server_id: str,
        request_id: int | str,
        request: InferenceRequest,
        *,
        now: float,
        chunks: Notify | None,
    ) -> tuple[dict[str, object], str]:
        """Run one admitted request: the result for the server and the model that answered.

        With ``chunks``, each text delta is sent as ``inference/chunk`` (one index counter,
        from 0) before the result is returned.
        """
        model = self.route(server_id, request.feature_set)
        if model is None:
            raise RpcError(
                code=INTERNAL_ERROR,
                message=f"no model answers inference requests from {server_id} "
                "(configure inference_models on the server or [host] inference_model)",
            )
        self.take_budget(server_id, now)
        index = 0

        async def on_delta(delta: str) -> None:
            nonlocal index
            assert chunks is not None
            await chunks("inference/chunk", chunk_params(request_id, index, delta))
            index += 1

        model_request = ModelRequest(
            agent=f"{server_id}/{request.feature_set}",
            system=request.system,
            messages=[
                {"role": role, "blocks": [{"type": "text", "text": content}], "metadata": {}}
                for role, content in request.messages
            ],
            max_tokens=request.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=request.temperature,
        )
        try:
            reply = await model.complete(model_request, on_delta if chunks is not None else None)
        except ModelError as exc:
            raise RpcError(code=INTERNAL_ERROR, message=f"inference failed: {exc}") from None
        used = reply.model or model.name
        result = inference_result(
            content=reply.text,
            model=used,
            finish_reason=finish_reason(reply.stop_reason),
            input_tokens=int(reply.usage.get("input_tokens", 0)),
            output_tokens=int(reply.usage.get("output_tokens", 0)),
        )
        return result, used
