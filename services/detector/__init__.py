"""The detector stage service."""
