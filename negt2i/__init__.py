"""NegT2IBench evaluator: does a text-to-image model withhold what a prompt forbids?"""

from negt2i import _aliases

__version__ = "0.1.0"

# The pure core lives in negt2i.core; its old paths (negt2i.spec, negt2i.verdict, ...) stay importable
# as the same module objects (negt2i/_aliases.py). Nothing is imported eagerly.
_aliases.install()
