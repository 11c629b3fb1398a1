"""``python -m bench [name ...]``: run the named benchmarks, or every ``bench/*.py``.

A bench that raises is reported (its traceback) and the others still run; the exit status
is 1 when any failed."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import pathlib
import sys
import traceback
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent


def available() -> list[str]:
    """Benchmark module names (every ``bench/*.py`` except the package's own files)."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def run(name: str) -> dict[str, Any]:
    """Import ``bench.<name>`` and call its ``main()`` (awaiting it when it is async)."""
    mod = importlib.import_module(f"bench.{name}")
    main = getattr(mod, "main", None)
    if main is None:
        raise SystemExit(f"bench/{name}.py has no main()")
    result = main()
    if inspect.isawaitable(result):
        result = asyncio.run(result)  # type: ignore[arg-type]
    return dict(result)


def cli(argv: list[str]) -> int:
    names = argv or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"== bench {name} ==", flush=True)
        try:
            run(name)
        except Exception:  # noqa: BLE001 -- one broken bench must not stop the others
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)} (the others ran)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
