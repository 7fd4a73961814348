"""An OpenAI-compatible LLM server as library code: continuous batching on the event loop
(`batcher`), KV-cache slots with a prefix cache (`slots`), the OpenAI protocol (`protocol`), grammar
token masks for structured outputs (`grammar`), tool calls (`tools`), prompt-lookup speculative
decoding (`speculative`), the ASGI app (`app`), Prometheus metrics (`metrics`) and start-up
(`startup`). examples/serve_llm.py wires them up.

    engine, tokenizer = build_engine(slots=16, context=512)
    batcher = Batcher(engine, tokenizer, max_waiting=64, metrics=ServerMetrics())
    warm_in_background(batcher, engine, tokenizer.eos_id)  # the longer shapes, once /health answers
    uvicorn.run(make_app(batcher, tokenizer, grammars=Grammars(tokenizer)))
"""
from atensor.serve.app import ServerConfig, make_app
from atensor.serve.batcher import Batcher
from atensor.serve.grammar import Grammars
from atensor.serve.metrics import ServerMetrics
from atensor.serve.requests import Generation, RequestError
from atensor.serve.slots import SlotCache
from atensor.serve.startup import build_engine, favour_the_loop, warm_in_background

__all__ = ["Batcher", "Generation", "Grammars", "RequestError", "ServerConfig", "ServerMetrics", "SlotCache", "build_engine",
           "favour_the_loop", "make_app", "warm_in_background"]
