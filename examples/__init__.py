"""Examples that are imported by name (``NEGT2I_BACKEND_MODULES=examples.plugin_detector``)."""
