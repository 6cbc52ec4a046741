"""RQ worker entrypoint: ``python worker.py [--queues q1,q2] [--redis-url URL] ...``.

Same flags as ``voxcast worker``; configuration comes from ``VOXCAST_*`` variables. The model is
loaded and warmed before the first job is taken. Also usable through RQ's CLI:
``rq worker -w voxcast.serving.rq.worker.VoxcastWorker -S rq.serializers.JSONSerializer``.
"""

import sys

from voxcast.logs import setup_logging
from voxcast.serving.cli.queue import worker_main

if __name__ == "__main__":
    setup_logging()  # VOXCAST_LOG_LEVEL, default INFO; credentials in URLs redacted
    sys.exit(worker_main(sys.argv[1:]))
