"""Streams a completion from SmolLM2-135M (atensor, KV cache, jitted decode) to the terminal.

    python examples/generate.py "The capital of France is" --max-tokens 64
    python examples/generate.py --chat "Write a haiku about tensors." --temperature 0.7 --seed 1
    python examples/generate.py "Once upon a time" --dtype float32   # the weights dequantized first
    python examples/generate.py "Once upon a time" --dtype q8act     # llama.cpp's Q8-activation numerics
    python examples/generate.py "Once upon a time" --dtype float32 --device CL   # on OpenCL (docs/opencl.md)

Prints the text as it is generated, then the prompt length, time to first token, decode tokens/s,
the model's load time and the process's peak resident memory (the first runs also capture the jitted
steps; `--warmup` does that before timing). By default the GGUF file's quantized tensors are used as
stored (memory-mapped, multiplied in their blocks: docs/quantized.md).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", help="the text to continue (with --chat: the user's message)")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--warmup", action="store_true", help="capture the jitted steps before timing")
    parser.add_argument("--dtype", choices=("quantized", "q8act", "float32"), default="quantized",
                        help="quantized: the file's blocks as stored (default); q8act: the same with llama.cpp's "
                             "numerics (activations quantized to Q8_0, not exact); float32: dequantized at load")
    parser.add_argument("--device", default="CPU", help="CPU (default) or an OpenCL device, CL or CL:N "
                        "(with --dtype float32: packed weights do not render to OpenCL)")
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens {args.max_tokens}: generate at least 1 token")
    if args.temperature < 0:
        parser.error(f"--temperature {args.temperature}: use 0 (greedy) or more")
    if args.top_k < 0 or not 0 < args.top_p <= 1:
        parser.error(f"--top-k {args.top_k} --top-p {args.top_p}: top-k is 0 (no limit) or more, top-p in (0, 1]")

    from atensor.models.generation import LlamaEngine, SamplingParams
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    gguf = load_gguf()
    if not 0 < args.context <= gguf.config.context_length:
        parser.error(f"--context {args.context}: the model takes 1 to {gguf.config.context_length} tokens")
    tokenizer = GGUFTokenizer(gguf.metadata)
    text = tokenizer.render_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    ids = tokenizer.encode(text)
    if not ids or len(ids) >= args.context:
        parser.error(f"the prompt is {len(ids)} tokens; it must be 1 to {args.context - 1} tokens to leave room "
                     f"for one generated token in --context {args.context} (raise --context or shorten it)")
    loading = time.perf_counter()
    model = Llama(gguf, slots=1, context=args.context, device=args.device,
                  weights={"quantized": "packed"}.get(args.dtype, args.dtype))
    load_s = time.perf_counter() - loading
    engine = LlamaEngine(model)
    if args.warmup:
        for _ in range(3):
            list(engine.generate(ids, 4))
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    out: list[int] = []
    shown = ""
    start = time.perf_counter()
    first = None
    for token in engine.generate(ids, args.max_tokens, params, stop_ids=tokenizer.end_ids):
        if first is None:
            first = time.perf_counter()
        out.append(token)
        now = tokenizer.decode(out)
        if not now.endswith("\ufffd"):  # wait for a whole UTF-8 character
            sys.stdout.write(now[len(shown):])
            sys.stdout.flush()
            shown = now
    end = time.perf_counter()
    sys.stdout.write(tokenizer.decode(out)[len(shown):] + "\n")
    if first is None:
        print("(no tokens generated)")
        return
    rate = (len(out) - 1) / (end - first) if len(out) > 1 else float("nan")
    print(f"\n[{len(ids)} prompt tokens, {len(out)} generated; first token {1000 * (first - start):.0f} ms; "
          f"decode {rate:.1f} tokens/s; {args.dtype} weights loaded in {load_s:.2f} s; peak resident memory "
          f"{_peak_rss_mb():.0f} MB]", file=sys.stderr)


def _peak_rss_mb() -> float:
    """The process's peak resident memory (VmHWM), in MB; NaN where /proc is not there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


if __name__ == "__main__":
    main()
