"""Examples of calling the orchestrator from a generator."""
