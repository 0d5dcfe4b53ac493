"""The human annotation study: element questions (``questions``) and the labelling kit (``task``)."""
