"""The run loop: what ``negt2i evaluate``, ``negt2i submit`` and ``negt2i generate --score`` share.

- ``negt2i.run.jobs``: the jobs (GenEval-layout folders, JSONL manifests), shards, resume keys, and each
  job's image read once (bytes, SHA-256, the one decoder);
- ``negt2i.run.output``: the results run: the one results writer, resume by content, the one place where
  a results line is made (in-process verdicts, stream answers, errors) and the one tally (``Summary``);
- ``negt2i.run.stream``: the one stream submitter (``StreamSubmitter``): jobs in order over
  ``EvaluateStream`` with back-pressure, the one retry policy and the stall watchdog, answers in order;
- ``negt2i.run.remote``: what a streaming run reads from the orchestrator (rules, models, the health names
  and stages its jobs need).

The drivers are ``negt2i.evaluate`` (the in-process pipeline), ``negt2i.submit`` and
``negt2i.generate.scoring``; ``negt2i.client`` holds only the gRPC client classes.
"""
