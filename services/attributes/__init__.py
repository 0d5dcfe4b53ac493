"""The attributes stage service."""
