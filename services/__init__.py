"""BentoML stage services: one ``@bentoml.service`` per perception stage (see ``docs/services.md``)."""
