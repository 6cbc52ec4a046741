"""RunPod serverless entrypoint: ``python handler.py`` (production) or with ``--rp_serve_api`` (local).

Loads and warms the voxcast service before the RunPod worker loop starts (a failed load exits
non-zero), then serves jobs with an async generator handler. Configuration is read from the
environment (``VOXCAST_*``); see ``voxcast.serving.runpod.main``.
"""

from voxcast.logs import setup_logging
from voxcast.serving.runpod.main import main

if __name__ == "__main__":
    setup_logging()  # VOXCAST_LOG_LEVEL, default INFO; credentials in URLs redacted
    raise SystemExit(main())
