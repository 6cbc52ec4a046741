"""``voxcast voices``: the voices a model answers to, as a server on the same settings would.

Lists the model's built-in speakers, the aliases (OpenAI's voice names mapped to the speakers, and
``VOXCAST_VOICE_ALIASES``), the default voice, and the voices registered in the configured store
(``VOXCAST_STORAGE_DIR`` or ``VOXCAST_S3_*``) for this model. Loads the model without warming it.

::

    voxcast voices --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
    voxcast voices --json
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "voices",
        help="list a model's speakers, its voice aliases and the store's registered voices",
        description="Loads the model (no warm-up) and opens the configured store, as voxcast serve would.",
    )
    p.add_argument("--model", help="checkpoint directory or hub id (default: VOXCAST_MODEL)")
    p.add_argument("--device", help="auto, cpu, cuda (default: VOXCAST_DEVICE)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def _listing(service: Any) -> dict[str, Any]:
    """Speakers, aliases, the default voice and registered voices of a loaded service."""
    registered = []
    for info in service.voices.list_voices():
        if info.builtin:
            continue
        registered.append({k: v for k, v in info.to_dict().items() if k in ("voice_id", "name", "ref_text")})
    return {
        "model": service.engine.identity,
        "speakers": list(service.engine.speakers),
        "aliases": dict(sorted(service.voice_aliases.items())),
        "default_voice": service.default_voice(),
        # a model that speaks a voice of its own when a request names none (Chatterbox Turbo)
        "builtin_voice": bool(service.engine.render_settings.get("builtin_voice")),
        "registered": registered,
    }


def _print_table(listing: dict[str, Any]) -> None:
    print(f"model: {listing['model']}")
    print("speakers: " + (", ".join(listing["speakers"]) or "none (a Base model: register voices)"))
    default = listing["default_voice"]
    if default is None and listing["builtin_voice"]:
        default = "the checkpoint's built-in voice (a request without a voice speaks it)"
    print(f"default voice: {default or 'none (a request names its voice or brings ref_audio)'}")
    print("aliases:" + ("" if listing["aliases"] else " none"))
    for alias, voice in listing["aliases"].items():
        print(f"  {alias:<12} -> {voice}")
    print("registered voices:" + ("" if listing["registered"] else " none"))
    for voice in listing["registered"]:
        name = f"  {voice['name']!r}" if voice.get("name") else ""
        text = f"  ref_text={voice['ref_text'][:60]!r}" if voice.get("ref_text") else ""
        print(f"  {voice['voice_id']}{name}{text}")


def run(args: argparse.Namespace) -> int:
    from voxcast.engine.engine import Engine
    from voxcast.service import Service, ServiceConfig
    from voxcast.storage.factory import open_store

    env = dict(os.environ)
    for flag, name in (("model", "VOXCAST_MODEL"), ("device", "VOXCAST_DEVICE")):
        if getattr(args, flag):
            env[name] = getattr(args, flag)
    env["VOXCAST_WARMUP"] = "0"
    config = ServiceConfig.from_env(env)  # bad settings fail before the model loads
    store = open_store(config.storage)
    engine = Engine.load(config.engine)
    service = Service.assemble(config, engine, store)
    try:
        listing = _listing(service)
    finally:
        service.close()
    if args.json:
        print(json.dumps(listing, indent=1))
    else:
        _print_table(listing)
    return 0
