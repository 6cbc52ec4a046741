"""HTTP server entrypoint: ``python server.py [--host H] [--port P] [--model M]``.

The OpenAI-compatible speech API, voice management and ``/ping`` on one preloaded, warmed service;
the same as ``voxcast serve``. Configuration comes from ``VOXCAST_*`` variables (``PORT`` and
``PORT_HEALTH`` on RunPod load-balancing endpoints); see ``voxcast.serving.http``.
"""

from voxcast.serving.http.main import main

if __name__ == "__main__":
    raise SystemExit(main())
