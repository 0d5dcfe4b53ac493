"""Perception stages: one small interface per stage and a registry of backends by name."""
