"""RunPod serverless entrypoint: ``python handler.py`` (production) or with ``--rp_serve_api`` (local).

Loads and warms the voxcast service before the RunPod worker loop starts (a failed load exits
non-zero), then serves jobs with an async generator handler. Configuration is read from the
environment (``VOXCAST_*``); see ``voxcast.serving.runpod.main``.
"""

import logging
import os

from voxcast.serving.runpod.main import main

if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("VOXCAST_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    raise SystemExit(main())
