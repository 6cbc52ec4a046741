"""The HTTP server: an OpenAI-compatible speech API and voice management on one preloaded Service.

:mod:`.speech` maps OpenAI's ``/v1/audio/speech`` body onto voxcast's request schema, :mod:`.app`
builds the ASGI application, :mod:`.main` runs it (``voxcast serve``, ``server.py``).
"""
