"""An OpenAI-compatible LLM server: SmolLM2-135M on atensor, continuous batching on the event loop.

    python examples/serve_llm.py --port 8000 --slots 16
    curl -s localhost:8000/v1/completions -d '{"prompt": "The capital of France is", "max_tokens": 8}'
    curl -sN localhost:8000/v1/chat/completions \\
        -d '{"messages": [{"role": "user", "content": "Hi!"}], "stream": true}'

The `openai` client works against it: POST /v1/completions and /v1/chat/completions (the model's chat
template from the GGUF metadata) with max_tokens, temperature, top_p, top_k, seed, stop, n,
frequency_penalty, presence_penalty, logprobs (chat: top_logprobs too), stream with
stream_options.include_usage, response_format (json_object, json_schema), tools with tool_choice (auto,
none, required, a named function; SmolLM2's function-calling format, arguments constrained to the
function's schema), and vLLM's ignore_eos; GET /health, /metrics (Prometheus) and /v1/models.
Structured outputs and tool calls are decoded under a grammar (llguidance's token masks). Fields OpenAI
defines that the server does not implement (logit_bias, audio, ...) are a 400 naming them; unknown
fields are ignored. The pieces are library code in atensor/serve/: this
program loads and warms the model (printing its progress) and runs the app under uvicorn (asyncio),
or hypercorn on trio with --server hypercorn-trio. The model loop is a task on the same event loop,
awaiting atensor's jitted steps: there is no model thread.
"""
from __future__ import annotations

import argparse
from typing import Optional

from atensor.serve import Batcher, ServerConfig, ServerMetrics, build_engine, favour_the_loop, make_app
from atensor.serve.batcher import BATCH_WAIT
from atensor.serve.slots import MIN_REUSE
from atensor.serve.startup import warm_in_background

WORKER_NICE = 10  # the model's threads' nice while serving (favour_the_loop)


def build_app(args: argparse.Namespace):
    """The app of the parsed arguments: the model loaded and warmed up, the batcher, the metrics."""
    import atensor
    engine, tokenizer = build_engine(args.slots, args.context, args.prefill_buckets, warmup=not args.no_warmup)
    metrics = ServerMetrics()
    batcher = Batcher(engine, tokenizer, args.max_waiting, batch_wait=args.batch_wait_ms / 1000,
                      prefix_cache=not args.no_prefix_cache, min_reuse=args.prefix_min_tokens, metrics=metrics,
                      thread_nice=args.worker_nice, speculative=args.speculative)
    metrics.watch(batcher)
    grammars = None
    try:
        from atensor.serve.grammar import Grammars
        grammars = Grammars(tokenizer)
    except ImportError:
        print("serve_llm: llguidance is not installed: response_format and tools are refused "
              "(pip install llguidance)", flush=True)
    if not (args.no_warmup or args.no_background_warmup):
        warm_in_background(batcher, engine, tokenizer.eos_id)

    def on_start() -> None:
        atensor.settings.worker_nice = args.worker_nice  # atensor's workers started from now on
        favour_the_loop(args.worker_nice)
    return make_app(batcher, tokenizer, ServerConfig(on_start=on_start), metrics, grammars)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=int, default=16, help="requests generating at once (KV-cache slots)")
    parser.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond the slots; then 503")
    parser.add_argument("--context", type=int, default=512, help="tokens per slot (prompt plus completion)")
    parser.add_argument("--prefill-buckets", type=int, nargs="*", default=None,
                        help="prompt lengths prefill is padded to (default 16 64 128 256 512)")
    parser.add_argument("--batch-wait-ms", type=float, default=1000 * BATCH_WAIT,
                        help="how long an idle server waits for more of a burst of requests before it "
                             "prefills them together (default %(default)s; 0: never)")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="always prefill whole prompts (never reuse a finished request's cells)")
    parser.add_argument("--prefix-min-tokens", type=int, default=MIN_REUSE,
                        help="the shortest cached prefix worth reusing (default %(default)s)")
    parser.add_argument("--speculative", type=int, default=0, metavar="K",
                        help="prompt-lookup speculative decoding: check K draft tokens per greedy stream per "
                             "step (default 0: off; bench/serve_llm_load.py measures where it pays)")
    parser.add_argument("--no-warmup", action="store_true", help="capture the steps on first use instead")
    parser.add_argument("--no-background-warmup", action="store_true",
                        help="warm only what the first requests need before /health; the longer shapes are "
                             "captured on first use instead of while the server is idle")
    parser.add_argument("--worker-nice", type=int, default=WORKER_NICE,
                        help="the nice of every thread but the event loop's, once serving (default "
                             "%(default)s; 0: leave them as they are)")
    parser.add_argument("--server", choices=("uvicorn", "hypercorn-trio"), default="uvicorn",
                        help="uvicorn on asyncio (default) or hypercorn on trio")
    args = parser.parse_args(argv)
    app = build_app(args)
    print(f"serve_llm: smollm2 on http://{args.host}:{args.port} ({args.slots} slots, context {args.context}, "
          f"{args.server})", flush=True)
    if args.server == "uvicorn":
        import uvicorn
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    else:
        import trio
        from hypercorn.config import Config
        from hypercorn.trio import serve
        config = Config()
        config.bind = [f"{args.host}:{args.port}"]
        config.loglevel = "WARNING"
        trio.run(serve, app, config)


if __name__ == "__main__":
    main()
