"""OpenAI-compatible HTTP layer (API process): Starlette app, engine client over ZMQ."""
from serve.api.app import ServerState, build_app
from serve.api.engine_client import EngineClient, EngineDeadError

__all__ = ["EngineClient", "EngineDeadError", "ServerState", "build_app"]
