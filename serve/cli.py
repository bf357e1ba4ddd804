"""`python -m serve [MODEL]`: an OpenAI-compatible server (API process + engine process).

Start-up order: bind the port (fail fast if taken), start the engine process and wait for its
model, build the app with the engine's tokenizer, serve; the URL is printed once requests are
accepted. SIGINT/SIGTERM: uvicorn drains connections (bounded), then the engine process is
asked to exit, terminated if it does not, and reaped. If the engine dies, the server answers
503 and exits with status 1.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from serve import ipc

log = logging.getLogger("serve")
LOG_FORMAT = ipc.LOG_FORMAT   # the engine process logs in the same format
GRACEFUL_SHUTDOWN_S = 5   # uvicorn's limit for open connections after a signal
_STREAM_GRACE_S = 3.0     # default --shutdown-grace: in-flight requests may finish for this
                          # long, then end with a 503
_DEATH_GRACE_S = 0.5   # lets 503 bodies reach clients before the server stops


# --dtype / --kv-cache-dtype spellings users know from vLLM -> the engine's names
DTYPE_ALIASES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
                 "float": "float32", "float32": "float32"}
KV_DTYPE_ALIASES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}
GPU_ONLY_FLAGS = {"gpu_memory_utilization": "--gpu-memory-utilization"}


def default_threads() -> int:
    """Half the CPUs this process may run on, at least 1: one per physical core on SMT
    machines, and 1 on a 2-core machine, where a second thread competing with the API process
    and anything else on the box made decode steps 6-10x slower."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n // 2)


def _version() -> str:
    from importlib import metadata

    def v(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"
    return f"tskernels {v('tskernels')} (torch {v('torch')}, triton {v('triton')})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve", description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=None,
                   help="'default' (the embedded SmolLM2-135M-Instruct, on CPU without a GPU), "
                        "a local HF model directory, or 'dummy:<config>' (random weights) "
                        "(default: default)")
    p.add_argument("--model", dest="model_flag", metavar="MODEL",
                   help="the same as the positional MODEL (vLLM's spelling)")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on /v1/* and "
                   "/metrics (/health stays open); without a key, binding a non-loopback "
                   "address logs a warning")
    p.add_argument("--served-model-name", help="the model id clients see (default: the engine's name)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument("--engine", default=ipc.DEFAULT_ENGINE, help=argparse.SUPPRESS)  # tests: fake engines
    s = p.add_argument_group("limits and security")
    s.add_argument("--allowed-hosts", nargs="+", metavar="HOST",
                   help="Host header values answered (DNS-rebinding guard; '*': any). Default: "
                        "the bound address and localhost / 127.0.0.1 / ::1; any for 0.0.0.0 / ::")
    s.add_argument("--allowed-origins", nargs="+", metavar="ORIGIN",
                   help="browser origins allowed by CORS (e.g. http://localhost:3000; '*': any). "
                        "Default: none (no CORS headers)")
    s.add_argument("--max-waiting", type=int, default=1024,
                   help="engine requests that may wait beyond the running batch; more are "
                        "answered 503 with Retry-After (default: 1024; 0: none)")
    s.add_argument("--max-choices-per-request", type=int, default=256,
                   help="most engine requests (prompts x n) one API request may ask for (default: 256)")
    s.add_argument("--max-request-bytes", type=int, default=16 << 20,
                   help="request body limit, 413 beyond (default: 16 MiB)")
    s.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds for a request body to arrive, 408 after (default: 30)")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds for a request's headers to arrive before the connection is closed "
                        "(default: 10)")
    s.add_argument("--shutdown-grace", type=float, default=_STREAM_GRACE_S,
                   help="on SIGINT/SIGTERM, seconds in-flight requests may run before they end "
                        f"with a 503 (default: {_STREAM_GRACE_S:g})")
    o = p.add_argument_group("chat output", "how chat completions are parsed "
                             "(docs/OPENAI_FEATURES.md)")
    o.add_argument("--tool-call-parser", default="auto",
                   choices=["auto", "hermes", "llama3_json", "mistral"],
                   help="format of the model's tool calls (default: auto, from the chat "
                   "template: mistral for [TOOL_CALLS] templates, llama3_json for Llama 3 "
                   "templates, else hermes)")
    o.add_argument("--reasoning-parser", default="auto",
                   choices=["auto", "none", "think", "deepseek_r1"],
                   help="split <think>...</think> into reasoning_content (default: auto, "
                   "'think' when the tokenizer has <think> / </think> tokens)")
    e = p.add_argument_group("engine", "unset flags keep the engine's defaults")
    e.add_argument("--max-model-len", type=int, help="context length: prompt + completion tokens")
    e.add_argument("--max-num-seqs", type=int, help="most requests in one running batch")
    e.add_argument("--chunked-prefill-size", type=int, help="token budget per step (prefill chunks + decodes)")
    e.add_argument("--page-size", type=int,
                   help="tokens per KV page (default: 64 on a GPU, 16 on the CPU)")
    e.add_argument("--num-kv-pages", type=int, help="KV pool size in pages (instead of a memory fraction)")
    e.add_argument("--kv-cache-dtype", choices=list(KV_DTYPE_ALIASES), default="auto",
                   help="KV cache element type; auto: the model's dtype, fp8 = fp8_e4m3 "
                        "(default: %(default)s)")
    e.add_argument("--gpu-memory-utilization", type=float,
                   help="fraction of GPU memory for weights + KV (GPU only; default: 0.85)")
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV pages of shared prompt prefixes")
    e.add_argument("--dtype", choices=list(DTYPE_ALIASES), default="auto",
                   help="weights and activations; auto: float32 on the CPU, bfloat16 on a GPU; "
                        "half = float16, float = float32 (default: %(default)s)")
    e.add_argument("--quantization", choices=["auto", "none", "int8", "int4"], default="auto",
                   help="weight-only quantization: int8 keeps dense weights as int8 with a "
                        "scale per row, int4 as 4-bit groups of 32 (CPU only); auto: int8 "
                        "on the CPU when --dtype is auto, "
                        "else none (docs/CPU.md; default: %(default)s)")
    e.add_argument("--device", default="auto",
                   help="auto (a GPU when there is one), cpu, cuda or cuda:N (default: %(default)s)")
    e.add_argument("--threads", type=int, default=default_threads(),
                   help="CPU threads of the engine's torch / C++ kernels (default: half the "
                        "CPUs this process may use, at least 1: %(default)s here)")
    e.add_argument("--seed", type=int, help="seed for weights of dummy models and unseeded sampling")
    e.add_argument("--capture-shapes", metavar="PATH",
                   help="record the kernels' shape buckets of the traffic into PATH (autotune)")
    e.add_argument("--tune-window", dest="tune_window_s", type=float, metavar="SECONDS",
                   help="at start, tune the --capture-shapes buckets without a table entry for "
                        "at most SECONDS (GPU; kept in the user cache for the next start)")
    e.add_argument("--overlap-schedule", action=argparse.BooleanOptionalAction, default=None,
                   help="prepare step N+1 on the host while the device runs step N (default: on "
                        "a GPU)")
    e.add_argument("--cpu-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="CPU: record each decode batch size's kernel calls once and replay them "
                        "from C++ (default: on)")
    e.add_argument("--overlap-lookahead", action=argparse.BooleanOptionalAction, default=None,
                   help="with overlap: launch a greedy decode step's successor before its "
                        "sampled ids are back (default: on wherever overlap scheduling is)")
    return p


ENGINE_FLAGS = ("max_model_len", "max_num_seqs", "chunked_prefill_size", "page_size", "num_kv_pages",
                "kv_cache_dtype", "gpu_memory_utilization", "enable_prefix_caching", "dtype",
                "quantization", "device", "seed", "threads", "overlap_schedule", "cpu_graphs",
                "overlap_lookahead", "capture_shapes", "tune_window_s")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineArgs the user set; unset flags keep the engine's defaults."""
    kw = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k, None) is not None}
    if "dtype" in kw:
        kw["dtype"] = DTYPE_ALIASES[kw["dtype"]]
    if "kv_cache_dtype" in kw:
        kw["kv_cache_dtype"] = KV_DTYPE_ALIASES[kw["kv_cache_dtype"]]
    return kw


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, found before the engine process is
    spawned (a missing model, a GPU that is not there, a GPU-only flag on the CPU); None if
    nothing is. Also settles `args.model` from the positional or --model."""
    if args.model and args.model_flag and args.model != args.model_flag:
        return f"model given twice: {args.model!r} and --model {args.model_flag!r}"
    args.model = args.model_flag or args.model or "default"
    if args.engine == ipc.DEFAULT_ENGINE:   # fake test engines take made-up model names
        m = args.model
        if m.startswith("dummy:"):
            from serve.config import DUMMY_CONFIGS
            spec = m[len("dummy:"):]
            if spec not in DUMMY_CONFIGS and not (spec.endswith(".json") and os.path.isfile(spec)):
                return (f"model: unknown dummy config {spec!r}; named: "
                        f"{', '.join(sorted(DUMMY_CONFIGS))}, or dummy:/path/to/config.json")
        elif m != "default":
            if not os.path.isdir(m):
                return (f"model: {m!r} is not a directory (expected 'default', a local HF model "
                        "directory with config.json, or 'dummy:<config>')")
            if not os.path.isfile(os.path.join(m, "config.json")):
                return f"model: {m!r} has no config.json (not a Hugging Face model directory)"
    if args.threads is not None and args.threads < 1:
        return f"--threads: expected a positive int, got {args.threads}"
    dev = str(args.device)
    if dev not in ("auto", "cpu", "cuda") and not dev.startswith("cuda:"):
        return f"--device: expected auto, cpu, cuda or cuda:N, got {dev!r}"
    gpu_flags = [flag for k, flag in GPU_ONLY_FLAGS.items() if getattr(args, k, None) is not None]
    if dev.startswith("cuda") or gpu_flags:
        import torch
        has_gpu = torch.cuda.is_available()
        if dev.startswith("cuda") and not has_gpu:
            return f"--device {dev}: no CUDA GPU is visible to torch {torch.__version__}"
        if dev.startswith("cuda:") and int(dev.split(":", 1)[1] or 0) >= torch.cuda.device_count():
            return f"--device {dev}: only {torch.cuda.device_count()} GPU(s) visible"
        if gpu_flags and (dev == "cpu" or not has_gpu):
            return f"{', '.join(gpu_flags)}: GPU-only, but the engine runs on the CPU"
    return None


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(False)
    return sock


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"python -m serve: error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    for name in ("max_waiting", "max_choices_per_request", "max_request_bytes"):
        if getattr(args, name) < (0 if name == "max_waiting" else 1):
            print(f"error: --{name.replace('_', '-')}: expected a "
                  f"{'non-negative' if name == 'max_waiting' else 'positive'} int, got "
                  f"{getattr(args, name)}", file=sys.stderr)
            return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(_serve(args, sock))
    finally:
        sock.close()


async def _serve(args: argparse.Namespace, sock: socket.socket) -> int:
    import uvicorn

    from serve.api import EngineClient, EngineDeadError, ServerState, build_app
    from serve.metrics import ServerMetrics
    from serve.api.reasoning import resolve_parser as resolve_reasoning_parser
    from serve.api.tools import resolve_tool_parser

    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    phase = {"name": "loading"}

    def on_signal(signum, frame):
        # While loading, abort start-up; while serving, uvicorn's own handler is installed and
        # re-raises the signal after draining, which lands here again and is ignored.
        if phase["name"] == "loading":
            log.info("signal %d during start-up; stopping", signum)
            loop.call_soon_threadsafe(main_task.cancel)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    from serve.api.guards import HttpLimits, default_allowed_hosts, header_timeout_protocol, is_loopback

    if not is_loopback(args.host) and not args.api_key:
        log.warning("binding %s (not loopback) without --api-key: anyone who can reach this "
                    "port can use the model and read /metrics", args.host)
    limits = HttpLimits(max_body_bytes=args.max_request_bytes, body_timeout_s=args.body_timeout,
                        header_timeout_s=args.header_timeout,
                        max_choices=args.max_choices_per_request, api_key=args.api_key,
                        allowed_hosts=args.allowed_hosts or default_allowed_hosts(args.host))
    client = EngineClient(args.model, engine_kwargs(args), target=args.engine,
                          max_waiting=args.max_waiting)
    exit_code = 0
    try:
        try:
            info = await client.start()
        except EngineDeadError as e:
            log.error("%s", e)
            return 1
        except asyncio.CancelledError:
            return 0
        name = args.served_model_name or info["model_name"]
        state = ServerState(client=client, tokenizer=info["tokenizer"], model_name=name,
                            max_model_len=info["max_model_len"],
                            model_names={name, info["model_name"], args.model}, limits=limits,
                            metrics=ServerMetrics(name))
        state.tool_call_parser = resolve_tool_parser(args.tool_call_parser, state.tokenizer)
        state.reasoning_parser = resolve_reasoning_parser(args.reasoning_parser, state.tokenizer)
        log.info("chat output: tool calls parsed as %s, reasoning parser %s",
                 state.tool_call_parser, state.reasoning_parser or "none")
        config = uvicorn.Config(build_app(state, args.api_key, args.allowed_origins),
                                lifespan="off", log_config=None, log_level=args.log_level,
                                access_log=args.access_log,
                                # past the grace: ended requests' 503 bodies still go out
                                timeout_graceful_shutdown=max(GRACEFUL_SHUTDOWN_S,
                                                              int(args.shutdown_grace) + 2),
                                http=header_timeout_protocol(args.header_timeout))
        server = uvicorn.Server(config)

        def on_engine_death():
            nonlocal exit_code
            if server.should_exit:   # a signal for the whole process group: not a failure
                return
            exit_code = 1
            loop.call_later(_DEATH_GRACE_S, setattr, server, "should_exit", True)

        client.on_engine_death = on_engine_death
        phase["name"] = "serving"
        helpers = [asyncio.create_task(_announce(server, sock, name)),
                   asyncio.create_task(_end_requests_on_exit(server, client,
                                                             args.shutdown_grace))]
        await server.serve(sockets=[sock])
        for task in helpers:
            task.cancel()
        phase["name"] = "stopping"
        log.info("stopping the engine process")
        return exit_code
    finally:
        phase["name"] = "stopping"
        await client.shutdown()


async def _end_requests_on_exit(server, client, grace_s: float = _STREAM_GRACE_S) -> None:
    """After a signal, lets in-flight requests run for a while, then ends them with a 503
    (an SSE error event for streams) so clients see a complete response, not a cut connection."""
    from serve.api.engine_client import ShuttingDownError

    while not server.should_exit:
        await asyncio.sleep(0.05)
    client.closing = True
    await asyncio.sleep(grace_s)
    client.fail_all(ShuttingDownError("the server is shutting down"))


async def _announce(server, sock: socket.socket, model_name: str) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"Serving {model_name} at http://{host}:{port}/v1 (OpenAI API; /health, /metrics)",
          flush=True)
