"""The pure core: prompts, perception records, rule constants, the rules, the per-image flow, results lines.

Every module in this package imports numpy, scipy and pydantic only: no torch, grpc, bentoml or httpx,
and nothing of ``negt2i.stages`` (the backends) or ``negt2i.wire`` (the protobuf adapter).
``tests/core/test_pure_core.py`` imports each module here alone in a fresh interpreter and checks.
The shells (``negt2i.pipeline``, ``negt2i.run``, ``negt2i.wire``, the services and the orchestrator)
drive the core; the core never imports them.

The modules moved here from the package top (``negt2i.spec`` is now ``negt2i.core.spec``); the old
paths keep working for outside code as aliases of the same module objects (``negt2i._aliases``).
"""
