"""Workspace snapshots against a plain tar + one Object Store object, on one nats-server.

A deterministic 50 MB, 5,000-file workspace (mostly small text files, some larger
binaries) under ``work/`` and ``home/``. Side by side, each on a fresh restore directory:

- baton: ``WorkspaceStore.snapshot`` of the tree's tar (first turn, then a turn that
  changed one file, deduped against the first) and ``restore_to_dir``;
- plain: ``tarfile`` the directory -> one ``object_store.put``; ``get`` -> extract
  (nats-py defaults: 128 KiB chunks; the get writes into a buffer).

Targets: restore <= 1.5 x the plain tar+get; the one-file turn stores <= 2% of the first
turn's bytes. Writes ``bench/results/workspace.json`` and prints a table.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import pathlib
import random
import shutil
import tarfile
import tempfile
import time
from typing import Any

import nats

from baton.workspaces import WorkspaceConfig, WorkspaceStore
from baton_tools.testing.servers import NatsServer

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "workspace.json"
FILES = 5000
BINARIES = 20
BINARY_BYTES = 1_500_000  # 20 x 1.5 MB = 30 MB of binaries, ~20 MB of text
REPEAT = 3
WORDS = ("def", "return", "import", "self", "value", "class", "for", "in", "range", "print", "if", "else",
         "async", "await", "None", "True", "lambda", "yield", "with", "as", "try", "except", "raise")


def make_tree(root: pathlib.Path, seed: int = 7) -> int:
    """Write the workspace; returns its bytes of file content."""
    rnd = random.Random(seed)
    total = 0
    for i in range(FILES - BINARIES):
        d = root / ("home/.claude/projects" if i % 10 == 0 else f"work/pkg{i % 40}/mod{i % 7}")
        d.mkdir(parents=True, exist_ok=True)
        lines = rnd.randint(20, 160)
        text = "\n".join(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 12))) + f"  # {i}.{n}"
                         for n in range(lines)) + "\n"
        (d / f"f{i}.py").write_text(text)
        total += len(text.encode())
    (root / "work/assets").mkdir(parents=True, exist_ok=True)
    for i in range(BINARIES):
        data = rnd.randbytes(BINARY_BYTES)
        (root / f"work/assets/b{i}.bin").write_bytes(data)
        total += len(data)
    return total


def tar_of(root: pathlib.Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for top in ("work", "home"):
            tar.add(root / top, arcname=top)
    return buf.getvalue()


async def timed(coro: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await coro
    return time.perf_counter() - t0, out


async def bench(url: str, tmp: pathlib.Path) -> dict[str, Any]:
    nc = await nats.connect(servers=[url])
    try:
        src = tmp / "src"
        content = make_tree(src)
        store = WorkspaceStore(nc, WorkspaceConfig(objects="bench-ws", heads="bench-heads", timeout=120.0))
        await store.provision()
        js = nc.jetstream(timeout=120.0)
        plain = await js.create_object_store("bench-plain")

        async def baton_snapshot(parent: str | None) -> Any:
            return await store.snapshot(await asyncio.to_thread(tar_of, src), parent=parent)

        async def plain_put() -> int:
            blob = await asyncio.to_thread(tar_of, src)
            await plain.put("tree", blob)
            return len(blob)

        async def plain_get(dest: pathlib.Path) -> None:
            buf = io.BytesIO()
            await plain.get("tree", writeinto=buf)

            def extract() -> None:
                buf.seek(0)
                with tarfile.open(fileobj=buf) as tar:
                    tar.extractall(dest, filter="tar")
            await asyncio.to_thread(extract)

        def fresh(name: str) -> pathlib.Path:
            d = tmp / name
            shutil.rmtree(d, ignore_errors=True)
            return d

        rows: dict[str, Any] = {}
        t_first, first = await timed(baton_snapshot(None))
        t_plain_put, plain_bytes = await timed(plain_put())
        restore_first = [(await timed(store.restore_to_dir(first.digest, fresh("r1"))))[0] for _ in range(REPEAT)]
        get_plain = [(await timed(plain_get(fresh("p1"))))[0] for _ in range(REPEAT)]
        # A turn that changed one file.
        victim = src / "work/pkg3/mod3/f3.py"
        victim.write_text(victim.read_text() + "# edited\n")
        t_second, second = await timed(baton_snapshot(first.digest))
        t_plain_put2, _ = await timed(plain_put())
        restore_second = [(await timed(store.restore_to_dir(second.digest, fresh("r2"))))[0] for _ in range(REPEAT)]
        get_plain2 = [(await timed(plain_get(fresh("p2"))))[0] for _ in range(REPEAT)]
        assert (tmp / "r2/work/pkg3/mod3/f3.py").read_text() == victim.read_text()
        rows = {
            "files": FILES, "content_bytes": content, "tar_bytes": plain_bytes,
            "first": {"baton_snapshot_s": t_first, "baton_stored_bytes": first.bytes_stored,
                      "plain_put_s": t_plain_put, "plain_stored_bytes": plain_bytes,
                      "baton_restore_s": min(restore_first), "plain_get_extract_s": min(get_plain)},
            "one_file": {"baton_snapshot_s": t_second, "baton_stored_bytes": second.bytes_stored,
                         "plain_put_s": t_plain_put2, "plain_stored_bytes": plain_bytes,
                         "baton_restore_s": min(restore_second), "plain_get_extract_s": min(get_plain2)},
        }
        rows["restore_ratio"] = max(rows["first"]["baton_restore_s"] / rows["first"]["plain_get_extract_s"],
                                    rows["one_file"]["baton_restore_s"] / rows["one_file"]["plain_get_extract_s"])
        rows["one_file_stored_fraction"] = second.bytes_stored / first.bytes_stored
        rows["targets"] = {"restore_ratio<=1.5": rows["restore_ratio"] <= 1.5,
                           "one_file_stored_fraction<=0.02": rows["one_file_stored_fraction"] <= 0.02}
        await js.delete_object_store("bench-plain")
        await js.delete_object_store("bench-ws")
        await js.delete_key_value("bench-heads")
        return rows
    finally:
        await nc.close()


def table(r: dict[str, Any]) -> str:
    lines = [f"workspace: {r['files']} files, {r['content_bytes'] / 1e6:.1f} MB of content",
             f"{'turn':<10}{'':<8}{'snapshot s':>11}{'stored MB':>11}{'restore s':>11}"]
    for turn in ("first", "one_file"):
        x = r[turn]
        lines.append(f"{turn:<10}{'baton':<8}{x['baton_snapshot_s']:>11.2f}{x['baton_stored_bytes'] / 1e6:>11.3f}{x['baton_restore_s']:>11.2f}")
        lines.append(f"{'':<10}{'plain':<8}{x['plain_put_s']:>11.2f}{x['plain_stored_bytes'] / 1e6:>11.3f}{x['plain_get_extract_s']:>11.2f}")
    lines.append(f"restore baton/plain: {r['restore_ratio']:.2f}x (target <= 1.5); one-file turn stored "
                 f"{100 * r['one_file_stored_fraction']:.2f}% of the first (target <= 2%)")
    return "\n".join(lines)


async def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ws-") as d:
        tmp = pathlib.Path(d)
        server = NatsServer(tmp / "nats")
        server.start()
        try:
            result = await bench(server.url, tmp)
        finally:
            server.kill()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    asyncio.run(main())
