"""The local store holds plain files: the directory itself is the deliverable (a WAV is a WAV)."""

from __future__ import annotations

import io
import json
import shutil
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxcast.serving.cli.main import main
from voxcast.storage.base import BlobStore
from voxcast.storage.export import export_prefix
from voxcast.storage.local import LocalBlobStore


def _wav(seconds: float = 0.2, rate: int = 8000, subtype: str = "ULAW") -> bytes:
    buf = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 440 * t), rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def test_objects_are_plain_files_with_metadata_beside_them(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "store", fsync=False)
    wav = _wav()
    assert store.put_bytes(
        "libraries/ivr/mulaw8k/hello.wav", wav, content_type="audio/wav", metadata={"lufs": "-19.0"}
    )
    store.put_bytes("libraries/ivr/manifest.json", b'{"prompts": []}', content_type="application/json")
    path = tmp_path / "store" / "libraries/ivr/mulaw8k/hello.wav"
    assert (
        path.read_bytes() == wav and path.read_bytes()[:4] == b"RIFF" and path.read_bytes()[8:12] == b"WAVE"
    )
    with sf.SoundFile(path) as f:  # soundfile opens the stored file itself
        assert f.samplerate == 8000 and f.subtype == "ULAW"
    assert json.loads((tmp_path / "store/libraries/ivr/manifest.json").read_bytes()) == {"prompts": []}
    info = store.head("libraries/ivr/mulaw8k/hello.wav")
    assert info is not None and info.content_type == "audio/wav" and dict(info.metadata) == {"lufs": "-19.0"}
    assert info.size == len(wav)
    assert list(store.list_keys("libraries/")) == [
        "libraries/ivr/manifest.json",
        "libraries/ivr/mulaw8k/hello.wav",
    ]
    store.delete("libraries/ivr/mulaw8k/hello.wav")
    assert not path.exists() and not (tmp_path / "store/.meta/libraries/ivr/mulaw8k/hello.wav.json").exists()


def test_create_once_and_overwrite_keep_body_and_metadata_together(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path, fsync=False)
    assert store.put_bytes("k", b"first", metadata={"v": "1"}, if_none_match=True)
    assert not store.put_bytes("k", b"second!", metadata={"v": "2"}, if_none_match=True)
    assert store.get_bytes("k") == b"first" and dict(store.head("k").metadata) == {"v": "1"}  # type: ignore[union-attr]
    assert store.put_bytes("k", b"third", metadata={"v": "3"})
    assert store.get_bytes("k") == b"third" and dict(store.head("k").metadata) == {"v": "3"}  # type: ignore[union-attr]


def test_a_copied_store_keeps_its_metadata(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "a", fsync=False)
    store.put_bytes(
        "voices/x.bin", b"\x00\x01" * 100, content_type="application/octet-stream", metadata={"t": "1"}
    )
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # new inodes
    copy = LocalBlobStore(tmp_path / "b", fsync=False)
    info = copy.head("voices/x.bin")
    assert (
        info is not None
        and dict(info.metadata) == {"t": "1"}
        and copy.get_bytes("voices/x.bin") == b"\x00\x01" * 100
    )


def test_files_of_older_versions_and_files_put_there_by_hand_are_read(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path, fsync=False)
    header = json.dumps({"content_type": "audio/wav", "metadata": {"old": "yes"}}).encode()
    (tmp_path / "legacy.wav").write_bytes(struct.pack(">4sI", b"VXB1", len(header)) + header + b"RIFFbody")
    info = store.head("legacy.wav")
    assert (
        info is not None
        and dict(info.metadata) == {"old": "yes"}
        and store.get_bytes("legacy.wav") == b"RIFFbody"
    )
    (tmp_path / "dropped.wav").write_bytes(_wav())
    info = store.head("dropped.wav")
    assert info is not None and "wav" in info.content_type and dict(info.metadata) == {}


def test_export_a_library_as_a_directory_and_as_archives(
    blob_store: BlobStore, tmp_path: Path, capsys
) -> None:
    wav = _wav()
    for key in (
        "libraries/acme/mulaw8k/hi.wav",
        "libraries/acme/mulaw8k/bye.wav",
        "libraries/acme/manifest.json",
    ):
        blob_store.put_bytes(key, wav if key.endswith(".wav") else b"{}")
    blob_store.put_bytes("libraries/other/x.wav", wav)
    report = export_prefix(blob_store, "libraries/acme/", tmp_path / "out")
    assert (report.files, report.bytes) == (3, 2 * len(wav) + 2)
    files = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()
    )
    assert files == ["manifest.json", "mulaw8k/bye.wav", "mulaw8k/hi.wav"]
    assert sf.info(str(tmp_path / "out/mulaw8k/hi.wav")).samplerate == 8000
    export_prefix(blob_store, "libraries/acme/mulaw8k/", tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        assert sorted(zf.namelist()) == ["bye.wav", "hi.wav"] and zf.read("hi.wav") == wav
    export_prefix(blob_store, "libraries/acme/", tmp_path / "a.tar.gz")
    with tarfile.open(tmp_path / "a.tar.gz") as tf:
        assert sorted(tf.getnames()) == ["manifest.json", "mulaw8k/bye.wav", "mulaw8k/hi.wav"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    with pytest.raises(FileNotFoundError, match="nothing is stored"):
        export_prefix(blob_store, "libraries/none/", tmp_path / "none")


def test_export_command_on_the_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    LocalBlobStore(tmp_path / "store", fsync=False).put_bytes(
        "libraries/acme/pcm16k/hi.wav", _wav(rate=16000, subtype="PCM_16")
    )
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(tmp_path / "store"))
    monkeypatch.delenv("VOXCAST_S3_BUCKET", raising=False)
    assert main(["export", "libraries/acme/", str(tmp_path / "lib")]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 1
    assert sf.info(str(tmp_path / "lib/pcm16k/hi.wav")).samplerate == 16000
    assert main(["export", "libraries/nope/", str(tmp_path / "x")]) == 2
    assert "nothing is stored under 'libraries/nope/'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["x.rar", "x.7z", "x.tar.bz2"])
def test_export_to_an_archive_kind_it_cannot_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, name: str
) -> None:
    """Before: ``export ... x.rar`` silently made a folder named ``x.rar``."""
    LocalBlobStore(tmp_path / "store", fsync=False).put_bytes(
        "libraries/acme/a.wav", _wav(rate=16000, subtype="PCM_16")
    )
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(tmp_path / "store"))
    monkeypatch.delenv("VOXCAST_S3_BUCKET", raising=False)
    assert main(["export", "libraries/acme/", str(tmp_path / name)]) == 2
    assert f"cannot write '{name}'" in capsys.readouterr().err and not (tmp_path / name).exists()
