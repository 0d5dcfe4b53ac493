"""The gRPC orchestrator: composes the stage services per prompt and applies the rules (``negt2i.v1.Evaluator``)."""
