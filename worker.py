"""RQ worker entrypoint: ``python worker.py [--queues q1,q2] [--redis-url URL] ...``.

Same flags as ``voxcast worker``; configuration comes from ``VOXCAST_*`` variables. The model is
loaded and warmed before the first job is taken. Also usable through RQ's CLI:
``rq worker -w voxcast.serving.rq.worker.VoxcastWorker -S rq.serializers.JSONSerializer``.
"""

import logging
import sys

from voxcast.serving.cli.queue import worker_main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(worker_main(sys.argv[1:]))
