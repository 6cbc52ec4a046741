"""Prompt-library manifests (CSV, JSON or YAML) -> validated prompts + per-row errors.

A manifest lists prompts: ``id`` and ``text`` are required; ``voice``, ``language``, ``instruct``,
``max_frames``, ``non_streaming_text``, ``speed`` (0.25-4.0: the rate, pitch kept) and the sampling
fields (``seed``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``greedy``) are
optional per-row overrides.

* CSV: a header row naming the columns; empty cells mean "not set".
* JSON / YAML: a list of row objects, or ``{"defaults": {...}, "prompts": [...]}`` where ``defaults``
  apply to every row that does not set the field itself.

Bad rows (missing/duplicate/unsafe id, empty text, unknown column, out-of-range value) become
:class:`RowError` entries naming the row and field; the good rows are still returned. Only a manifest
that cannot be read at all raises :class:`~voxcast.errors.InvalidRequest` (``field="manifest"``).

Seeds: prerendered prompts are always seeded so that they are reproducible and cacheable. A row
without ``seed`` (and without ``greedy``) gets :func:`default_seed` of its id: the first 31 bits of
SHA-256(``"voxcast-prerender:" + id``). Changing a prompt's text keeps its seed; renaming it changes it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from voxcast.engine.request import SamplingParams, SynthesisRequest, parse_request
from voxcast.errors import InvalidRequest

__all__ = [
    "NAME_RE",
    "Manifest",
    "Prompt",
    "RowError",
    "default_seed",
    "detect_format",
    "parse_manifest",
    "prompt_from_row",
]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Prompt ids and library names: safe as one storage-key component."""

ROW_FIELDS = frozenset(
    {"text", "voice", "language", "instruct", "max_frames", "non_streaming_text", "speed"}
    | set(SamplingParams.model_fields)
)
"""Columns a row may set (besides ``id``); format and rate come from the presets."""

MAX_PROMPTS = 10_000
"""Rows per manifest (one job); split bigger libraries."""


@dataclass(frozen=True)
class Prompt:
    """One valid row.

    Attributes:
        id: prompt id (unique in the manifest).
        row: 1-based row number (CSV: data row after the header).
        request: the validated request (PCM at 24 kHz, seeded, cache on).
        fields: the row's effective fields (defaults merged, seed filled in), JSON-able.
    """

    id: str
    row: int
    request: SynthesisRequest
    fields: dict[str, Any]

    def to_row(self) -> dict[str, Any]:
        """The prompt as a JSON-able row (``id``, ``row``, ``fields``) for :func:`prompt_from_row`."""
        return {"id": self.id, "row": self.row, "fields": self.fields}


@dataclass(frozen=True)
class RowError:
    """A row that was not rendered (or failed while rendering)."""

    row: int
    id: str | None
    field: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "id": self.id, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class Manifest:
    prompts: list[Prompt] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)


def default_seed(prompt_id: str) -> int:
    """The seed of a prompt that sets none (see the module docstring)."""
    digest = hashlib.sha256(f"voxcast-prerender:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def detect_format(text: str, hint: str | None = None) -> str:
    """``csv``, ``json`` or ``yaml``: ``hint`` (a format name or a file name) wins, else sniffed."""
    if hint:
        h = hint.lower().rsplit(".", 1)[-1]
        if h in ("csv", "json"):
            return h
        if h in ("yaml", "yml"):
            return "yaml"
        raise InvalidRequest(f"unknown manifest format {hint!r} (csv, json or yaml)", field="manifest_format")
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        return "json"
    first = stripped.splitlines()[0] if stripped else ""
    if first.startswith(("- ", "prompts:", "defaults:", "---")):
        return "yaml"
    return "csv"


def _load_rows(text: str, fmt: str) -> tuple[list[Any], dict[str, Any]]:
    """Raw rows and manifest-level defaults."""
    try:
        if fmt == "csv":
            reader = csv.DictReader(io.StringIO(text))
            if not reader.fieldnames:
                raise InvalidRequest("the CSV manifest has no header row", field="manifest")
            rows = [_csv_row({k.strip(): v for k, v in r.items() if k is not None}) for r in reader]
            return rows, {}
        data: Any = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, csv.Error) as e:
        raise InvalidRequest(f"the {fmt} manifest cannot be parsed: {e}", field="manifest") from e
    if isinstance(data, Mapping):
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise InvalidRequest("manifest defaults must be an object", field="manifest.defaults")
        return _as_list(data.get("prompts")), dict(defaults)
    return _as_list(data), {}


def _as_list(rows: Any) -> list[Any]:
    if not isinstance(rows, list):
        raise InvalidRequest("a manifest is a list of prompts (or {defaults, prompts})", field="manifest")
    return rows


#: Fields whose CSV cell is a whole number (the request schema takes integers there, not strings).
_CSV_INTEGERS = frozenset(
    {"seed", "top_k", "max_frames", "first_chunk_frames", "chunk_frames", "max_new_tokens"}
)


def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """A CSV row's integer cells as integers (``"5"`` -> 5); any other text stays for the schema to
    refuse, naming the field."""
    for key in _CSV_INTEGERS & row.keys():
        cell = row[key]
        if isinstance(cell, str) and cell.strip().lstrip("+-").isdigit():
            row[key] = int(cell.strip())
    return row


def _clean(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """Drop empty cells; strip strings."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, str):
            v = v.strip()
            if not v:
                continue
        if v is None:
            continue
        out[str(k).strip()] = v
    return out


def _prompt(row_no: int, raw: Any, defaults: Mapping[str, Any]) -> Prompt:
    """Validate one row.

    Raises:
        InvalidRequest: naming the field at fault.
    """
    if not isinstance(raw, Mapping):
        raise InvalidRequest("row is not an object", field="row")
    row = {**_clean(defaults), **_clean(raw)}
    pid = str(row.pop("id", "")).strip()
    if not pid:
        raise InvalidRequest("id is missing", field="id")
    if not NAME_RE.match(pid):
        raise InvalidRequest(f"id {pid!r} must match {NAME_RE.pattern}", field="id")
    unknown = sorted(set(row) - ROW_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown or not per-row field {unknown[0]!r}", field=unknown[0])
    if "seed" not in row and not _truthy(row.get("greedy")):
        row["seed"] = default_seed(pid)
    request = parse_request(
        {
            **row,
            "response_format": "pcm",
            "sample_rate": 24000,
            "cache": True,
            "request_id": f"prerender-{pid}",
        }
    )
    fields = request.model_dump(mode="json", include=set(ROW_FIELDS - set(SamplingParams.model_fields)))
    if fields["speed"] == 1.0:  # left out: render hashes from before the field existed still hold
        del fields["speed"]
    fields["sampling"] = request.sampling.model_dump(mode="json")
    return Prompt(pid, row_no, request, fields)


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in {"1", "true", "yes", "on"})


def parse_manifest(text: str, fmt: str | None = None, defaults: Mapping[str, Any] | None = None) -> Manifest:
    """Parse and validate a manifest.

    Args:
        text: the manifest.
        fmt: ``csv``/``json``/``yaml`` or a file name to take the extension from (default: sniffed).
        defaults: fields applied to rows that do not set them (under the manifest's own defaults).

    Returns:
        The valid prompts (in manifest order) and the errors of the other rows.

    Raises:
        InvalidRequest: the manifest as a whole cannot be read, is empty, is too long, or no prompt
            has a text (a misspelt column).
    """
    rows, own_defaults = _load_rows(text, detect_format(text, fmt))
    if not rows:
        raise InvalidRequest("the manifest has no prompts", field="manifest")
    if len(rows) > MAX_PROMPTS:
        raise InvalidRequest(
            f"the manifest has {len(rows)} rows; the limit is {MAX_PROMPTS}", field="manifest"
        )
    merged = {**dict(defaults or {}), **own_defaults}
    keys = {str(k).strip() for r in rows if isinstance(r, Mapping) for k in r}
    if keys and "text" not in keys and "text" not in merged:
        raise InvalidRequest(  # a misspelt header: one error, not one per row
            f"no prompt has a text (column or key 'text'); the manifest has {', '.join(sorted(keys))}",
            field="manifest",
        )
    out = Manifest()
    seen: set[str] = set()
    for i, raw in enumerate(rows, start=1):
        rid = (str(raw.get("id", "")).strip() or None) if isinstance(raw, Mapping) else None
        try:
            prompt = _prompt(i, raw, merged)
        except InvalidRequest as e:
            out.errors.append(RowError(i, rid, e.field or "row", e.message))
            continue
        if prompt.id in seen:
            out.errors.append(RowError(i, prompt.id, "id", f"duplicate id {prompt.id!r}"))
            continue
        seen.add(prompt.id)
        out.prompts.append(prompt)
    return out


def prompt_from_row(data: Mapping[str, Any]) -> Prompt:
    """The prompt :meth:`Prompt.to_row` wrote (validated again: it may come from a queue payload).

    Raises:
        InvalidRequest: naming the field at fault.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("fields"), Mapping):
        raise InvalidRequest("a prompt row is {id, row, fields}", field="prompts")
    fields = dict(data["fields"])
    sampling = fields.pop("sampling", None) or {}
    if not isinstance(sampling, Mapping):
        raise InvalidRequest("sampling must be an object", field="sampling")
    return _prompt(int(data.get("row", 0)), {"id": data.get("id"), **fields, **sampling}, {})
