"""The segmenter stage service."""
