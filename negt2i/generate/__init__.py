"""``negt2i generate``: the benchmark's images from a text-to-image model, scored while they are made.

The paper's protocol (Appendix E.1, Table 18): four samples per prompt with seeds
42..45, each pipeline's native settings, no prompt engineering, no negative
prompt. ``presets`` holds the eleven configurations; ``registry`` the generator
backends (diffusers built in; plug in your own); ``runner`` writes the GenEval
layout with provenance beside every sample and resumes; ``scoring`` streams new
images to the orchestrator with a bound on what is in flight.

Nothing here imports torch or diffusers until a model is loaded.
"""

from negt2i.generate.presets import DEFAULT_SEEDS, PRESETS, Component, ModelSpec, parse_seeds, preset
from negt2i.generate.registry import GenerateError, Generator, available, create, register_generator
from negt2i.generate.runner import GenerateSummary, Sample, generate, plan

__all__ = [
    "DEFAULT_SEEDS",
    "PRESETS",
    "Component",
    "GenerateError",
    "GenerateSummary",
    "Generator",
    "ModelSpec",
    "Sample",
    "available",
    "create",
    "generate",
    "parse_seeds",
    "plan",
    "preset",
    "register_generator",
]
