"""Carry Python wheels to a GPU host that has no package index, in pieces that fit a transfer limit.

Standard library only (runs on the build machine's Python and on the GPU host's).

  python3 wheels.py slim WHEEL                 drop the vLLM files a Hopper run of dense models never loads
  python3 wheels.py check DIR PRESENT_FILE     each wheel's Requires-Dist that neither DIR nor the host has
  python3 wheels.py pack DIR CARRY             split big wheels into parts, group files into batches
  python3 wheels.py assemble STAGE WHEELDIR    verify the parts, re-join them, verify the wheels

Layout written by `pack` (CARRY = bench/gpu/carry):
  CARRY/b1/, CARRY/b2/, ...   the files of each transfer batch (whole small wheels, or parts
                              NAME.whl.part-000, -001, ... of big ones); every batch also holds
                              the manifests, so any one batch says what a complete set is
  manifest-wheels.sha256      sha256sum lines of the whole wheels
  manifest-parts.sha256       sha256sum lines of every file that travels
  manifest-batches.txt        "<batch> <bytes> <file>" lines
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

MIB = 1024 * 1024

# Files of the vLLM 0.24 and 0.26 wheels that a bf16 dense model on Hopper (sm_90) never loads:
# - FA2 kernels: on sm_90 vLLM's flash-attention backend uses FA3 (FA2 is a guarded import);
# - MoE kernels: a guarded import, used by MoE models only;
# - vllm-rs: the Rust HTTP front end (`vllm serve`), not used by `vllm.LLM`;
# - sources of kernels JIT-built for Blackwell (fmha_sm100) and DeepGEMM builds for other Pythons.
SLIM_PATTERNS = (
    r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$",
    r"^vllm/_moe_C_stable_libtorch\.abi3\.so$",
    r"^vllm/vllm-rs$",
    r"^vllm/third_party/fmha_sm100/",
    r"^vllm/third_party/deep_gemm/_C\.cpython-31[0134]-",
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(8 * MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def slim(wheel: Path) -> None:
    """Rewrites `wheel` without the SLIM_PATTERNS files (and their RECORD lines)."""
    patterns = [re.compile(p) for p in SLIM_PATTERNS]
    tmp = wheel.with_suffix(".slim-tmp")
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        removed = {i.filename for i in src.infolist() if any(p.search(i.filename) for p in patterns)}
        for info in src.infolist():
            if info.filename in removed:
                dropped += info.compress_size
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in data.decode().splitlines() if line.split(",")[0] not in removed]
                data = ("\n".join(lines) + "\n").encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    tmp.replace(wheel)
    print(f"slim {wheel.name}: dropped {len(removed)} files ({dropped / MIB:.0f} MiB compressed)")


def _requirement_name(spec: str) -> str | None:
    """The distribution name of a Requires-Dist line; None for one that only an extra needs."""
    if ";" in spec and "extra" in spec.split(";", 1)[1]:
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    return _norm(match.group(1)) if match else None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(path: Path) -> str:
    return _norm(path.name.split("-")[0])


def check(wheel_dir: Path, present_file: Path) -> int:
    """Prints, per wheel, the requirements that neither the carried wheels nor the host provide."""
    carried = {_wheel_name(w) for w in wheel_dir.glob("*.whl")}
    present = {_norm(line.split("#")[0].strip()) for line in present_file.read_text().splitlines() if line.strip()}
    present.discard("")
    missing_any = 0
    for wheel in sorted(wheel_dir.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = HeaderParser().parsestr(z.read(meta_name).decode())
        needs = {n for spec in meta.get_all("Requires-Dist") or [] if (n := _requirement_name(spec))}
        missing = sorted(needs - carried - present)
        if missing:
            missing_any += 1
            print(f"{wheel.name}: not carried and not on the host: {', '.join(missing)}")
    print(f"checked {len(carried)} wheels; {missing_any} with requirements left out (see requirements-gpu.txt)")
    return 0


def pack(wheel_dir: Path, carry: Path, part_mb: int, batch_mb: int) -> None:
    """Splits wheels over part_mb MiB into parts and groups all files into batches of batch_mb MiB."""
    if carry.exists():
        shutil.rmtree(carry)
    pool = carry / "pool"
    pool.mkdir(parents=True)
    wheels = sorted(wheel_dir.glob("*.whl"))
    (carry / "manifest-wheels.sha256").write_text("".join(f"{sha256(w)}  {w.name}\n" for w in wheels))
    files: list[Path] = []
    for wheel in wheels:
        size = wheel.stat().st_size
        if size <= part_mb * MIB:
            shutil.copy2(wheel, pool / wheel.name)
            files.append(pool / wheel.name)
            continue
        with wheel.open("rb") as f:
            for index in range((size + part_mb * MIB - 1) // (part_mb * MIB)):
                part = pool / f"{wheel.name}.part-{index:03d}"
                part.write_bytes(f.read(part_mb * MIB))
                files.append(part)
    (carry / "manifest-parts.sha256").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
    # First-fit decreasing into batches.
    batches: list[list[Path]] = []
    sizes: list[int] = []
    for path in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        size = path.stat().st_size
        for i, used in enumerate(sizes):
            if used + size <= batch_mb * MIB:
                batches[i].append(path)
                sizes[i] += size
                break
        else:
            batches.append([path])
            sizes.append(size)
    lines = []
    for i, batch in enumerate(batches, 1):
        target = carry / f"b{i}"
        target.mkdir()
        for path in batch:
            path.rename(target / path.name)
            lines.append(f"b{i} {(target / path.name).stat().st_size} {path.name}\n")
    pool.rmdir()
    (carry / "manifest-batches.txt").write_text("".join(lines))
    for i in range(1, len(batches) + 1):
        for manifest in ("manifest-wheels.sha256", "manifest-parts.sha256", "manifest-batches.txt"):
            shutil.copy2(carry / manifest, carry / f"b{i}" / manifest)
    total = sum(sizes)
    print(f"{len(wheels)} wheels, {len(files)} files, {total / MIB:.1f} MiB in {len(batches)} batches:")
    for i, used in enumerate(sizes, 1):
        print(f"  b{i}: {used / MIB:.1f} MiB, {len(batches[i - 1])} files")


def assemble(stage: Path, wheel_dir: Path) -> int:
    """Checks that every part is in `stage` and intact, re-joins split wheels into `wheel_dir`."""
    parts = [line.split(None, 1) for line in (stage / "manifest-parts.sha256").read_text().splitlines() if line]
    missing = [name for _, name in parts if not (stage / name).exists()]
    if missing:
        batches = {}
        for line in (stage / "manifest-batches.txt").read_text().splitlines():
            batch, _, name = line.split()
            batches[name] = batch
        need = sorted({batches.get(name, "?") for name in missing})
        print(f"INCOMPLETE: {len(missing)} of {len(parts)} files missing (batches {', '.join(need)} not staged)")
        return 2
    bad = [name for digest, name in parts if sha256(stage / name) != digest]
    if bad:
        print(f"CORRUPT: {', '.join(bad)}")
        return 3
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for line in (stage / "manifest-wheels.sha256").read_text().splitlines():
        digest, name = line.split(None, 1)
        target = wheel_dir / name
        pieces = sorted(stage.glob(f"{name}.part-*"))
        with target.open("wb") as out:
            for piece in pieces or [stage / name]:
                with piece.open("rb") as f:
                    shutil.copyfileobj(f, out, 16 * MIB)
        if sha256(target) != digest:
            print(f"CORRUPT after joining: {name}")
            return 3
    print(f"all {len(parts)} files present and intact; wheels in {wheel_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("slim")
    p.add_argument("wheel", type=Path)
    p = sub.add_parser("check")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("present", type=Path)
    p = sub.add_parser("pack")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("carry", type=Path)
    p.add_argument("--part-mb", type=int, default=25)
    p.add_argument("--batch-mb", type=int, default=60)
    p = sub.add_parser("assemble")
    p.add_argument("stage", type=Path)
    p.add_argument("wheel_dir", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "slim":
        slim(args.wheel)
        return 0
    if args.cmd == "check":
        return check(args.wheel_dir, args.present)
    if args.cmd == "pack":
        pack(args.wheel_dir, args.carry, args.part_mb, args.batch_mb)
        return 0
    return assemble(args.stage, args.wheel_dir)


if __name__ == "__main__":
    sys.exit(main())
