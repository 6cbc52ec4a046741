"""Finding, checking and loading a Qwen3-TTS-12Hz checkpoint in the official layout.

A checkpoint is a directory (or a Hugging Face hub id, resolved with ``snapshot_download``; with
``HF_HUB_OFFLINE=1`` or ``local_files_only=True`` only the local hub cache is used) holding::

    config.json  generation_config.json (optional)
    model.safetensors | model.safetensors.index.json + shards
    vocab.json  merges.txt  tokenizer_config.json
    speech_tokenizer/{config.json, model.safetensors}

The network is built on the meta device and the safetensors tensors are assigned into it
(``load_state_dict(assign=True)``), so no random initialisation runs and no second copy of the
weights is made beyond the dtype/device conversion of one tensor at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from voxcast.errors import CheckpointError
from voxcast.models.fingerprint import weights_fingerprint
from voxcast.models.hub import resolve_checkpoint
from voxcast.models.qwen3_tts.code_predictor import CodePredictor
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig
from voxcast.models.qwen3_tts.layers import rope_inv_freq
from voxcast.models.qwen3_tts.talker import Talker
from voxcast.models.qwen3_tts.tokenizer import TOKENIZER_FILES

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder

__all__ = [
    "CheckpointFiles",
    "Qwen3TTSNet",
    "WidenedEmbedding",
    "checkpoint_identity",
    "load_network",
    "locate_checkpoint",
    "resolve_checkpoint",
]

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
SPEECH_TOKENIZER_DIR = "speech_tokenizer"


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of a validated checkpoint directory."""

    root: Path
    config: Path
    weights: tuple[Path, ...]
    speech_tokenizer: Path
    generation_config: Path | None


def locate_checkpoint(root: Path) -> CheckpointFiles:
    """Check that ``root`` has every file of the official layout.

    Raises:
        CheckpointError: naming every missing file.
    """
    missing: list[str] = []
    for name in ("config.json", *TOKENIZER_FILES):
        if not (root / name).is_file():
            missing.append(name)
    weights = _weight_files(root, missing)
    st = root / SPEECH_TOKENIZER_DIR
    for name in ("config.json", WEIGHTS_FILE):
        if not (st / name).is_file():
            missing.append(f"{SPEECH_TOKENIZER_DIR}/{name}")
    if missing:
        raise CheckpointError(f"{root}: not a Qwen3-TTS checkpoint, missing: {', '.join(missing)}")
    gen = root / "generation_config.json"
    return CheckpointFiles(root, root / "config.json", weights, st, gen if gen.is_file() else None)


def _weight_files(root: Path, missing: list[str]) -> tuple[Path, ...]:
    if (root / WEIGHTS_FILE).is_file():
        return (root / WEIGHTS_FILE,)
    index = root / WEIGHTS_INDEX
    if not index.is_file():
        missing.append(f"{WEIGHTS_FILE} (or {WEIGHTS_INDEX})")
        return ()
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{index}: unreadable weight index: {e}") from e
    missing.extend(s for s in shards if not (root / s).is_file())
    return tuple(root / s for s in shards)


def checkpoint_identity(files: CheckpointFiles, config: Qwen3TTSConfig) -> str:
    """A stable name for cache keys: kind, size, hash of both configs and a sample of the weights'
    bytes (:func:`voxcast.models.fingerprint.weights_fingerprint`: a fine-tune with the same config
    gets its own), and the weight byte counts.

    The same files give the same identity wherever they are stored.
    """
    h = hashlib.sha256()
    for p in (files.config, files.speech_tokenizer / "config.json"):
        h.update(p.read_bytes())
    h.update(weights_fingerprint([*files.weights, files.speech_tokenizer / WEIGHTS_FILE]).encode())
    size = sum(p.stat().st_size for p in files.weights)
    codec_size = (files.speech_tokenizer / WEIGHTS_FILE).stat().st_size
    kind = f"{config.tts_model_size or 'x'}-{config.tts_model_type}"
    return f"qwen3-tts-12hz-{kind}:{h.hexdigest()[:16]}:{size}+{codec_size}"


class Qwen3TTSNet(nn.Module):
    """The main ``model.safetensors`` as modules: ``talker`` and (Base) ``speaker_encoder``."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        t = config.talker
        self.talker = Talker(t, CodePredictor(t.code_predictor, t.hidden_size))
        self.speaker_encoder: SpeakerEncoder | None = None
        if config.speaker_encoder is not None:
            from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig

            raw = dict(config.raw.get("speaker_encoder_config") or {})
            self.speaker_encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(raw))

    def reset_rope(self, device: torch.device) -> None:
        """(Re)create the non-persistent RoPE buffers on ``device`` (after a meta-device build)."""
        t = self.talker
        cp = t.code_predictor
        t.inv_freq = rope_inv_freq(t.cfg.head_dim, t.cfg.rope_theta).to(device)
        cp.inv_freq = rope_inv_freq(cp.cfg.head_dim, cp.cfg.rope_theta).to(device)
        cp._rope_tables.clear()


#: Stored dtypes whose values float32 holds exactly, so a table kept in them loses nothing.
_EXACT_IN_FLOAT32 = (torch.bfloat16, torch.float16)


class WidenedEmbedding(nn.Embedding):
    """An embedding table kept in the narrower dtype it was stored in; looked-up rows are widened.

    Widening bfloat16/float16 to float32 is exact, so every lookup equals that of an
    :class:`~torch.nn.Embedding` holding the widened table, bit for bit, at half the memory. The
    talker's text embedding alone is 151936 x 2048 (1.2 GB in float32) and is only ever indexed.
    """

    def __init__(self, weight: Tensor, dtype: torch.dtype) -> None:
        super().__init__(weight.shape[0], weight.shape[1], _weight=weight, _freeze=True)
        self.out_dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        return super().forward(ids).to(self.out_dtype)


def _embedding_keys(net: nn.Module) -> set[str]:
    return {f"{name}.weight" for name, m in net.named_modules() if isinstance(m, nn.Embedding)}


def _read_tensors(
    files: tuple[Path, ...],
    device: torch.device,
    dtype: torch.dtype,
    keep_narrow: frozenset[str] = frozenset(),
    unused: frozenset[str] = frozenset(),
) -> dict[str, Tensor]:
    """Every tensor of ``files`` on ``device``, floating ones in ``dtype``, except the ``keep_narrow``
    keys stored in a dtype that float32 ``dtype`` holds exactly (see :class:`WidenedEmbedding`) and the
    ``unused`` keys, left as stored (a view of the file's memory map, so never read)."""
    out: dict[str, Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    t = f.get_tensor(key)
                    if key in unused:
                        out[key] = t
                        continue
                    narrow = key in keep_narrow and dtype == torch.float32 and t.dtype in _EXACT_IN_FLOAT32
                    to = t.dtype if narrow or not t.is_floating_point() else dtype
                    # A kept-narrow table is copied: as a view of the file's memory map it would keep
                    # the whole mapping (every page read while loading) resident. Other tensors are
                    # left as they were (a same-dtype tensor stays a view): copying them moved matmul
                    # operands and changed float32 prefill bits against the official implementation.
                    out[key] = t.to(device=device, dtype=to, copy=narrow)
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            raise CheckpointError(f"{path}: cannot read weights: {e}") from e
    return out


def _widen_on_lookup(net: nn.Module, dtype: torch.dtype) -> int:
    """Swap each embedding whose table is narrower than ``dtype`` for a :class:`WidenedEmbedding`;
    returns the bytes saved."""
    saved = 0
    for name, m in list(net.named_modules()):
        if type(m) is nn.Embedding and m.weight.dtype != dtype:
            parent_name, _, attr = name.rpartition(".")
            parent = net.get_submodule(parent_name) if parent_name else net
            setattr(parent, attr, WidenedEmbedding(m.weight.data, dtype))
            saved += m.weight.numel() * (dtype.itemsize - m.weight.element_size())
    return saved


def load_network(
    files: CheckpointFiles,
    config: Qwen3TTSConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    narrow_embeddings: bool = True,
    unused: frozenset[str] = frozenset(),
) -> Qwen3TTSNet:
    """Build :class:`Qwen3TTSNet` on the meta device and assign the checkpoint's tensors.

    Args:
        narrow_embeddings: keep embedding tables stored in bfloat16/float16 in that dtype when
            ``dtype`` is float32 (:class:`WidenedEmbedding`: same lookups, half the memory).
        unused: keys whose tensors the caller replaces before use (the int8 store's sources): left as
            stored, neither converted nor copied.

    Raises:
        CheckpointError: unreadable weights, or keys/shapes that do not match the config.
    """
    dev = torch.device(device)
    with torch.device("meta"):
        net = Qwen3TTSNet(config)
    keep = frozenset(_embedding_keys(net)) if narrow_embeddings else frozenset()
    state = _read_tensors(files.weights, dev, dtype, keep, unused)
    expected = dict(net.state_dict())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad_shape = sorted(
        k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or bad_shape:
        raise CheckpointError(
            f"{files.root}: weights do not match config.json: "
            f"missing {_few(missing)}, unexpected {_few(unexpected)}, wrong shape {_few(bad_shape)}"
        )
    net.load_state_dict(state, strict=True, assign=True)
    saved = _widen_on_lookup(net, dtype)
    if saved:
        logger.info("embedding tables kept in their stored dtype: %.0f MB saved", saved / 1e6)
    net.reset_rope(dev)
    net.eval().requires_grad_(False)
    logger.info("loaded %d tensors from %s (%s, %s)", len(state), files.root, dev, dtype)
    return net


def _few(keys: list[str]) -> str:
    if not keys:
        return "none"
    return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
