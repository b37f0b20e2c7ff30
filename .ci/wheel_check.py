"""Run by .ci/run with the python of a fresh venv that holds only the built wheel and its dependencies, from a
directory outside the checkout (`python -I`): every module of the installed package imports, and none of them
comes from the checkout. Prints the module count."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import sysconfig
from pathlib import Path

# Modules that need an optional extra at import time: without it, their ImportError names the extra.
OPTIONAL = {"mmfeed.testing.strategies": "mmfeed[testing]"}


def main() -> int:
    import mmfeed

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(mmfeed.__file__).resolve()
    if site not in where.parents:
        print(f"wheel check: mmfeed was imported from {where}, not from the venv's {site}", file=sys.stderr)
        return 1
    # mmfeed.__main__ runs the command line when imported: .ci/run runs `python -m mmfeed --version` instead
    names = ["mmfeed"] + [m.name for m in pkgutil.walk_packages(mmfeed.__path__, "mmfeed.")
                          if not m.name.endswith(".__main__")]
    failed = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, then the check fails
            if not (name in OPTIONAL and isinstance(exc, ImportError) and OPTIONAL[name] in str(exc)):
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if site not in Path(module.__file__).resolve().parents:
            failed.append(f"{name}: imported from {module.__file__}, outside the venv")
    for line in failed:
        print(f"wheel check: {line}", file=sys.stderr)
    print(f"wheel check: {len(names) - len(failed)} of {len(names)} modules of mmfeed {mmfeed.__version__} import "
          f"from {site} (those that need an extra say which: {', '.join(sorted(OPTIONAL.values()))})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
