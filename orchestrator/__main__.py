"""``python -m orchestrator [--port 50051] [--detector-url URL ...]``: run the gRPC orchestrator."""

import sys

from orchestrator.server import main

sys.exit(main())
