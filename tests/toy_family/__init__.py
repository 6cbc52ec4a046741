"""A toy third model family, written from :mod:`voxcast.models.base` alone (the contract's proof).

:mod:`.model` is a deterministic "model" whose frames are sine tones; :mod:`.family` is its
``FAMILY`` (loader, its family settings, a test-checkpoint builder). Nothing in ``engine/``,
``service/`` or ``serving/`` knows it: a test registers it with one line,
``registry.register("tests.toy_family.family")`` (a process started by a test: ``VOXCAST_FAMILIES``),
and serves it through the Engine, the Service, the HTTP server and the RQ worker
(``test_toy_family.py``).
"""
