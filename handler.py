"""RunPod serverless entrypoint: ``python handler.py`` (production) or with ``--rp_serve_api`` (local).

Queue endpoints (the default): loads and warms the voxcast service before the RunPod worker loop
starts (a failed load exits non-zero), then serves jobs with an async generator handler; see
``voxcast.serving.runpod.main``. Load-balancing endpoints: with ``VOXCAST_ENDPOINT_TYPE=http`` the
same image runs the HTTP server instead (``PORT``, ``/ping`` on ``PORT_HEALTH``); see
``voxcast.serving.endpoint``. Configuration is read from the environment (``VOXCAST_*``).
"""

from voxcast.serving.endpoint import main

if __name__ == "__main__":
    raise SystemExit(main())
