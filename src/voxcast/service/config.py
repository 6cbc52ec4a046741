"""``ServiceConfig``: everything a serving process is configured with, built from the environment.

A frozen dataclass built once by the pure :meth:`ServiceConfig.from_env` (testable without a model,
a store or a GPU); it holds the engine's and the store's own configurations and the service's
settings (storing renders, presigned URLs, the store guard, the watermark, voice names). Kept apart
from :mod:`voxcast.service.service` so that the settings and their documentation read on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from voxcast.engine.config import EngineConfig
from voxcast.envvars import env_bool, env_float, env_int
from voxcast.service.ref_audio_url import parse_hosts
from voxcast.storage.config import StorageConfig
from voxcast.storage.guard import GuardSettings
from voxcast.storage.pending import PendingSettings
from voxcast.voices.aliases import parse_aliases, parse_voice_name
from voxcast.watermark import check_watermark, watermark_from_env

__all__ = ["MAX_URL_EXPIRES_S", "ServiceConfig"]

#: Longest presigned URL lifetime S3 accepts (7 days).
MAX_URL_EXPIRES_S = 7 * 24 * 3600


@dataclass(frozen=True)
class ServiceConfig:
    """Everything a process needs to serve. Build with :meth:`from_env`.

    Attributes:
        engine: the engine configuration (``VOXCAST_MODEL``, ``VOXCAST_DEVICE``, ...).
        storage: the blob store configuration (``VOXCAST_S3_*``, ``VOXCAST_STORAGE_DIR``).
        store_audio: store every complete rendering (``VOXCAST_STORE_AUDIO``, on); the final message
            then carries its key instead of the audio.
        url_expires_s: lifetime of presigned URLs (``VOXCAST_URL_EXPIRES_S``, 3600; at most 604800,
            the 7 days S3 allows).
        store_guard: deadlines and circuit breaker of the store calls on a request's path
            (:mod:`voxcast.storage.guard`): ``VOXCAST_CACHE_LOOKUP_MS`` (100: then generation starts
            and the lookup counts as a miss), ``VOXCAST_STORE_WRITE_S`` (10: then the final message
            reports the write unconfirmed), ``VOXCAST_STORE_BREAKER_FAILURES`` (3 in a row open it),
            ``VOXCAST_STORE_BREAKER_COOLDOWN_S`` (30 s skipped, then one probe).
        store_pending: a render or cache fill the store failed is kept in memory and written once
            it answers (:mod:`voxcast.storage.pending`): at most ``VOXCAST_STORE_PENDING_MB`` (64;
            0: none kept), each tried for ``VOXCAST_STORE_PENDING_S`` (600).
        watermark: the watermark on stored renders (``VOXCAST_WATERMARK``: ``off``, the default, or
            ``perth``; :mod:`voxcast.watermark`): the stored copy and a file returned whole are
            marked, live streams are not (a cache hit streams the stored, marked copy).
        watermark_model: the watermark's weights (``VOXCAST_WATERMARK_MODEL``; default: the installed
            resemble-perth package's).
        voice_aliases: names for voices (``VOXCAST_VOICE_ALIASES``, e.g. ``alloy=ryan,nova=vivian``;
            :mod:`voxcast.voices.aliases`), keys in lower case; they replace OpenAI's names below.
        openai_voices: OpenAI's voice names (``alloy``, ``nova``, ...) are aliases of the model's
            speakers out of the box (``VOXCAST_OPENAI_VOICES``, on; :mod:`voxcast.voices.defaults`).
        ref_audio_url_hosts: hosts a ``ref_audio`` URL may name (``VOXCAST_REF_AUDIO_URL_HOSTS``,
            comma-separated; empty: no URL is fetched, :mod:`voxcast.service.ref_audio_url`).
        default_voice: the voice of a request that names none and brings no reference audio
            (``VOXCAST_DEFAULT_VOICE``: a speaker, alias or registered voice id; unset: ``alloy``'s
            speaker on a model with named speakers that clones no voices, else none).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    store_audio: bool = True
    url_expires_s: int = 3600
    store_guard: GuardSettings = field(default_factory=GuardSettings)
    store_pending: PendingSettings = field(default_factory=PendingSettings)
    watermark: str = "off"
    watermark_model: str | None = None
    voice_aliases: Mapping[str, str] = field(default_factory=dict)
    openai_voices: bool = True
    default_voice: str | None = None
    ref_audio_url_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        check_watermark(self.watermark)
        if not 1 <= self.url_expires_s <= MAX_URL_EXPIRES_S:
            raise ValueError(f"VOXCAST_URL_EXPIRES_S must be 1..{MAX_URL_EXPIRES_S} (S3 allows 7 days)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServiceConfig:
        watermark, watermark_model = watermark_from_env(env)
        return cls(
            engine=EngineConfig.from_env(env),
            storage=StorageConfig.from_env(env),
            store_audio=env_bool(env, "VOXCAST_STORE_AUDIO", True),
            url_expires_s=env_int(env, "VOXCAST_URL_EXPIRES_S", 3600, lo=1, hi=MAX_URL_EXPIRES_S),
            store_guard=GuardSettings(
                lookup_s=env_float(env, "VOXCAST_CACHE_LOOKUP_MS", 100.0, positive=True) / 1000,
                write_s=env_float(env, "VOXCAST_STORE_WRITE_S", 10.0, positive=True),
                failures=env_int(env, "VOXCAST_STORE_BREAKER_FAILURES", 3, positive=True),
                cooldown_s=env_float(env, "VOXCAST_STORE_BREAKER_COOLDOWN_S", 30.0, lo=0.0),
            ),
            store_pending=PendingSettings(
                max_bytes=int(env_float(env, "VOXCAST_STORE_PENDING_MB", 64.0, lo=0.0) * 2**20),
                max_age_s=env_float(env, "VOXCAST_STORE_PENDING_S", 600.0, positive=True),
            ),
            watermark=watermark,
            watermark_model=watermark_model,
            voice_aliases=parse_aliases(env.get("VOXCAST_VOICE_ALIASES")),
            openai_voices=env_bool(env, "VOXCAST_OPENAI_VOICES", True),
            default_voice=parse_voice_name(env.get("VOXCAST_DEFAULT_VOICE"), "VOXCAST_DEFAULT_VOICE"),
            ref_audio_url_hosts=parse_hosts(env.get("VOXCAST_REF_AUDIO_URL_HOSTS")),
        )
