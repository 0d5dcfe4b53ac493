"""The depth stage service."""
