"""The flags of `asyncrl serve`, declared apart from the server so that `asyncrl --help` builds its parser without
importing the HTTP stack (fastapi and uvicorn come with the `serve` extra)."""

from __future__ import annotations

import argparse

API_KEY_ENV = "ASYNCRL_API_KEY"
TOOL_CALL_PARSER_HELP = "tool-call format of the model's replies, a name in asyncrl.rollout.agent.TOOL_CALL_PARSERS"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="HF model folder (config.json, safetensors, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None,
                        help=f"key every route but /health asks for (Bearer token); default ${API_KEY_ENV}, else none")
    parser.add_argument("--served-model-name", default="",
                        help="the model name clients send (default: the folder's name)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:i or auto (cuda where available)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights and KV cache (auto: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sequences decoded together")
    parser.add_argument("--kv-cache-mb", type=int, default=256, help="KV cache size on CPU, in MiB")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="fraction of the GPU's memory for weights and KV cache")
    parser.add_argument("--num-threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--tool-call-parser", default="hermes", help=TOOL_CALL_PARSER_HELP)
    parser.add_argument("--max-request-bytes", type=int, default=8 * 2**20, help="larger bodies get 413")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
