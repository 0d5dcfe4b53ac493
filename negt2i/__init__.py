"""NegT2IBench evaluator: does a text-to-image model withhold what a prompt forbids?"""

__version__ = "0.1.0"
