"""The node image store's pure parts: keys, seeding a node's root, pruning stale stores.
(Importing into a store and starting nodes from it is every real-node test's fixture.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlkube_e2e.node import image_store
from rlkube_e2e.node.image_store import DATABASES, seed_root, store_key


def _fake_root(root: Path) -> None:
    blob = root / "io.containerd.content.v1.content" / "blobs" / "sha256" / "ab12"
    layer = root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs" / "usr" / "bin" / "python3"
    for path in (blob, layer, *(root / db for db in DATABASES)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(path.name.encode())
    layer.chmod(0o755)


def test_a_node_root_links_the_stores_files_and_owns_its_databases(tmp_path: Path) -> None:
    store, node = tmp_path / "store" / "root", tmp_path / "node" / "containerd" / "root"
    _fake_root(store)
    seed_root(store, node)
    for path in store.rglob("*"):
        if path.is_file():
            twin = node / path.relative_to(store)
            assert twin.read_bytes() == path.read_bytes()
            shared = twin.stat().st_ino == path.stat().st_ino
            # Blobs and layers are shared; the bolt databases containerd writes in place are not.
            assert shared is (str(path.relative_to(store)) not in DATABASES), path
    layer = node / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs" / "usr" / "bin" / "python3"
    assert layer.stat().st_mode & 0o777 == 0o755
    # A node's writes stay its own: a new file in its directories is not in the store.
    (layer.parent / "new").write_text("x")
    assert not (store / layer.relative_to(node).parent / "new").exists()
    # Seeding again (a restarted node) starts from the store afresh.
    seed_root(store, node)
    assert not (layer.parent / "new").exists()


def test_the_key_follows_the_archives_and_containerd_not_their_order(tmp_path: Path) -> None:
    a, b = tmp_path / "base-1.oci.tar", tmp_path / "trainer-cpu-2.oci.tar"
    assert store_key((a, b), "containerd 1.6") == store_key((b, a), "containerd 1.6")
    assert store_key((a, b), "containerd 1.6") != store_key((a, tmp_path / "trainer-cpu-3.oci.tar"), "containerd 1.6")
    assert store_key((a, b), "containerd 1.6") != store_key((a, b), "containerd 1.7")


def test_stores_whose_archives_are_gone_or_unfinished_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLKUBE_CACHE", str(tmp_path / "cache"))
    present, gone = tmp_path / "trainer-cpu-new.oci.tar", tmp_path / "trainer-cpu-old.oci.tar"
    present.write_text("")
    stores = image_store.stores_dir()
    for name, archive in (("current", present), ("superseded", gone), ("other", present)):
        (stores / name / "root").mkdir(parents=True)
        (stores / name / "archives.txt").write_text(f"{archive}\n")
    (stores / "abandoned.work" / "root").mkdir(parents=True)
    image_store._prune(keep=stores / "new")
    assert sorted(p.name for p in stores.iterdir()) == ["current", "other"]


def test_a_missing_archive_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "trainer-cpu-1.oci.tar"
    with pytest.raises(
        image_store.ImageStoreError, match=re.escape("trainer-cpu-1.oci.tar not found; run `make images`")
    ):
        image_store.ensure_store((missing,), Path("/usr/bin/containerd"), Path("/usr/bin/ctr"))
