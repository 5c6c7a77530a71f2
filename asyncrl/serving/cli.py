"""`asyncrl serve MODEL_DIR`: the OpenAI-compatible server on uvicorn.

    asyncrl serve outputs/demo/run/policy                         # http://127.0.0.1:8000/v1, no key
    ASYNCRL_API_KEY=secret asyncrl serve MODEL_DIR --port 8001     # every route but /health needs the key
    asyncrl serve MODEL_DIR --host 10.0.0.5 --api-key secret       # one interface of this machine, for its network

It binds to 127.0.0.1 unless --host says otherwise, and warns when it listens beyond loopback without a key:
anyone who reaches the port could then generate, reload weights from any folder the server can read, or
abort requests.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os

import torch
import uvicorn

from asyncrl.config import ConfigError
from asyncrl.engine import EngineConfig
from asyncrl.serving.app import ServerSettings, build_app
from asyncrl.serving.options import API_KEY_ENV
from asyncrl.serving.served_model import ServedModel, engine_dtype

logger = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(options: argparse.Namespace) -> int:
    """Runs the server until it is stopped (Ctrl-C, SIGTERM); a model folder that cannot be served is a
    ConfigError naming it."""
    logging.getLogger("asyncrl").setLevel(options.log_level.upper())
    api_key = options.api_key if options.api_key is not None else os.environ.get(API_KEY_ENV, "")
    if not is_loopback(options.host) and not api_key:
        logger.warning("listening on %s without an API key: anyone who reaches port %d can generate, reload weights "
                       "from any folder this process can read and abort requests; pass --api-key or set $%s",
                       options.host, options.port, API_KEY_ENV)
    if options.num_threads > 0:
        torch.set_num_threads(options.num_threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if options.device == "auto" else options.device
    engine_config = EngineConfig(max_num_seqs=options.max_num_seqs, cpu_kv_cache_mb=options.kv_cache_mb,
                                 gpu_memory_utilization=options.gpu_memory_utilization,
                                 max_model_len=options.max_model_len, device=device, dtype=engine_dtype(options.dtype))
    try:
        served = ServedModel.load(options.model_dir, engine_config, options.served_model_name)
    except (ValueError, OSError) as error:
        raise ConfigError(f"asyncrl serve {options.model_dir}: {error}") from None
    settings = ServerSettings(api_key=api_key, max_request_bytes=options.max_request_bytes,
                              tool_call_parser=options.tool_call_parser)
    logger.info("serving %s (%s) on http://%s:%d/v1", served.name, options.model_dir, options.host, options.port)
    uvicorn.run(build_app(served, settings), host=options.host, port=options.port, log_level=options.log_level,
                access_log=False)
    return 0
