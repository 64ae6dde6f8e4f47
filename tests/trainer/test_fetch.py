"""`rlkube-trainer fetch` (model.uri, data.uri) against the real S3-compatible server the
checkpoint tests run (gofakes3): a prefix fetched into a folder with its marker, not fetched
again while the source is unchanged, fetched again when an object changes; a cut-off fetch never
looks complete; a missing key or bucket and a full volume give errors naming the uri. hf://
through the Hub's own client against a local server speaking the Hub's API (hub_server.py):
resolved to a commit, fetched once, again on a new commit, the token sent; a missing repo and an
unreachable mirror give errors naming the repo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_e2e.s3server import S3Server
from rlkube_trainer.checkpoint.objectstore import ObjectPath, storage_options
from rlkube_trainer.fetch.place import MARKER, staging_of
from rlkube_trainer.fetch.run import FetchError, fetch
from rlkube_trainer.fetch.source import HubSource, S3Source, parse_source
from rlkube_trainer.pod.cli import main
from tests.trainer.hub_server import HubRepo, hub_server
from tests.trainer.small_volume import tmpfs

FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": b"w" * 4096, "tok/vocab.txt": b"a\nb\n"}


def upload(s3: S3Server, prefix: str, files: dict[str, bytes]) -> str:
    uri = f"s3://{s3.bucket}/{prefix}"
    root = ObjectPath(uri, storage_options(uri, s3.endpoint))
    for key, data in files.items():
        (root / key).write_bytes(data)
    return uri


def test_a_prefix_is_fetched_once_and_again_only_when_an_object_changed(s3: S3Server, tmp_path: Path) -> None:
    uri = upload(s3, "models/tiny", FILES)
    dest = tmp_path / "models" / "tiny"
    lines: list[str] = []
    first = fetch(uri, dest, s3.endpoint, progress=lines.append)
    assert first.downloaded
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == {
        **FILES,
        MARKER: (dest / MARKER).read_bytes(),
    }
    marker = json.loads((dest / MARKER).read_text())
    assert marker["uri"] == uri and marker["revision"] == first.revision
    assert {key: info["size"] for key, info in marker["files"].items()} == {k: len(v) for k, v in FILES.items()}
    assert all(info["etag"] for info in marker["files"].values())
    assert f"fetched 3/3 files, {sum(map(len, FILES.values()))}/{sum(map(len, FILES.values()))} bytes" in lines[-2]
    assert not staging_of(dest).exists()

    written = (dest / "model.safetensors").stat().st_mtime_ns
    lines.clear()
    again = fetch(uri, dest, s3.endpoint, progress=lines.append)
    assert not again.downloaded and again.revision == first.revision
    assert "nothing to fetch" in lines[0]
    assert (dest / "model.safetensors").stat().st_mtime_ns == written

    upload(s3, "models/tiny", {"model.safetensors": b"v" * 4096})
    changed = fetch(uri, dest, s3.endpoint, progress=lines.append)
    assert changed.downloaded and changed.revision != first.revision
    assert (dest / "model.safetensors").read_bytes() == b"v" * 4096


def test_a_cut_off_fetch_never_looks_complete_and_the_next_one_completes(s3: S3Server, tmp_path: Path) -> None:
    uri = upload(s3, "models/cut", FILES)
    dest = tmp_path / "model"

    def cut(line: str) -> None:
        raise KeyboardInterrupt(line)  # the process stopped after the first object

    with pytest.raises(KeyboardInterrupt):
        fetch(uri, dest, s3.endpoint, progress=cut)
    assert not dest.exists()  # only the staging folder holds the one object
    assert len([p for p in staging_of(dest).rglob("*") if p.is_file()]) == 1
    done = fetch(uri, dest, s3.endpoint, progress=lambda _: None)
    assert done.downloaded and (dest / MARKER).is_file() and not staging_of(dest).exists()

    # A newer revision cut off half-way leaves the complete older one in place.
    upload(s3, "models/cut", {"config.json": b"{}"})
    with pytest.raises(KeyboardInterrupt):
        fetch(uri, dest, s3.endpoint, progress=cut)
    assert json.loads((dest / MARKER).read_text())["revision"] == done.revision
    assert (dest / "config.json").read_bytes() == FILES["config.json"]


def test_a_missing_key_or_bucket_is_named_with_the_uri(s3: S3Server, tmp_path: Path) -> None:
    missing = f"s3://{s3.bucket}/models/none"
    with pytest.raises(FetchError, match=rf"{missing}: no object under this prefix \(NoSuchKey\)"):
        fetch(missing, tmp_path / "m", s3.endpoint)
    with pytest.raises(FetchError, match=r"s3://no-bucket/m: cannot list it: NoSuchBucket") as failed:
        fetch("s3://no-bucket/m", tmp_path / "m", s3.endpoint)
    assert failed.value.code is ExitCode.CONFIG
    # No server there: not the source's fault, run again (by the kubelet).
    with pytest.raises(FetchError, match=r"s3://no-bucket/m: cannot list it") as failed:
        fetch("s3://no-bucket/m", tmp_path / "m", "http://127.0.0.1:9")
    assert failed.value.code is ExitCode.UNEXPECTED
    # The command: the error on stderr and the class (CONFIG: fetching again cannot help) as exit code.
    assert main(["fetch", missing, str(tmp_path / "m"), "--endpoint-url", s3.endpoint]) == ExitCode.CONFIG
    assert not (tmp_path / "m").exists()


def test_a_full_volume_is_storage_full_naming_the_uri(s3: S3Server, tmp_path: Path) -> None:
    uri = upload(s3, "models/big", {"model.safetensors": b"w" * 512 * 1024})
    with tmpfs(tmp_path / "small", 128 * 1024) as volume:
        with pytest.raises(FetchError) as failed:
            fetch(uri, volume / "model", s3.endpoint, progress=lambda _: None)
        assert failed.value.code is ExitCode.STORAGE_FULL
        assert f"{uri}: no space left on the volume of {volume / 'model'}" in str(failed.value)
        assert not (volume / "model").exists()


def test_sources_parse_from_the_uri() -> None:
    assert parse_source("s3://b/p/q/") == S3Source("s3://b/p/q/", "b", "p/q")
    assert parse_source("hf://org/name") == HubSource("hf://org/name", "org/name", "main", "model")
    assert parse_source("hf://org/set@v1.0", "dataset") == HubSource("hf://org/set@v1.0", "org/set", "v1.0", "dataset")
    with pytest.raises(FetchError, match="org/name"):
        parse_source("hf://justname")


def test_an_unreachable_hub_mirror_is_named_with_the_repo(tmp_path: Path) -> None:
    with pytest.raises(FetchError) as failed:
        fetch("hf://org/tiny@main", tmp_path / "m", "http://127.0.0.1:9", progress=lambda _: None)
    assert "hf://org/tiny@main: cannot resolve model org/tiny@main at http://127.0.0.1:9" in str(failed.value)
    assert failed.value.code is ExitCode.UNEXPECTED  # no connection: the kubelet runs the fetch again
    assert not (tmp_path / "m").exists()


def test_a_hub_repo_is_resolved_to_its_commit_and_fetched_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    model = HubRepo("org/tiny", dict(FILES))
    rows = HubRepo("org/rows", {"train.parquet": b"rows"}, revision="v1", kind="datasets")
    with hub_server([model, rows]) as (endpoint, requests):
        dest = tmp_path / "model"
        first = fetch("hf://org/tiny", dest, endpoint, progress=lambda _: None)
        assert first.downloaded and first.revision == model.sha
        assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == {*FILES, MARKER}
        assert (dest / "model.safetensors").read_bytes() == FILES["model.safetensors"]
        assert json.loads((dest / MARKER).read_text())["revision"] == model.sha
        assert all(r.endswith("(Bearer hf_test_token)") for r in requests)

        requests.clear()
        assert not fetch("hf://org/tiny", dest, endpoint, progress=lambda _: None).downloaded
        assert requests == ["GET /api/models/org/tiny/revision/main (Bearer hf_test_token)"]  # resolved only

        model.files["config.json"] = b'{"model_type": "tinier"}'
        model.sha = "0" * 40  # a new commit on main
        assert fetch("hf://org/tiny", dest, endpoint, progress=lambda _: None).revision == model.sha
        assert (dest / "config.json").read_bytes() == b'{"model_type": "tinier"}'

        assert main(["fetch", "hf://org/rows@v1", str(tmp_path / "rows"), "--endpoint-url", endpoint, "--dataset"]) == 0
        assert (tmp_path / "rows" / "train.parquet").read_bytes() == b"rows"
        with pytest.raises(
            FetchError, match=r"hf://org/none: cannot resolve model org/none@main at .*RepositoryNotFound"
        ) as failed:
            fetch("hf://org/none", tmp_path / "none", endpoint)
        assert failed.value.code is ExitCode.CONFIG  # the Hub's answer: fetching again cannot change it
