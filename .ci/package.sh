#!/usr/bin/env bash
# CI: build the sdist and wheel (python -m build), install the wheel into a fresh virtualenv away from
# the source tree, import it, check what a wheel must carry, and run the demo and the CLI from the
# installed package. Every step says what it does and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
step() { echo "== package: $* ($((SECONDS - start)) s)"; }

step "building the sdist and the wheel (python -m build, in an isolated environment)"
python3 -m venv "$work/build-env"
"$work/build-env/bin/pip" install -q build
if ! "$work/build-env/bin/python" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1; then
  cat "$work/build.log"
  exit 1
fi
ls -l "$work/dist"

step "installing the wheel with [server,cli] into a fresh virtualenv"
python3 -m venv "$work/venv"
wheel=$(ls "$work"/dist/*.whl)
"$work/venv/bin/pip" install -q "${wheel}[server,cli]"

cd "$work"  # away from the source tree: only the installed package can be imported
step "importing it: version, typing marker, Lua scripts, subpackages"
"$work/venv/bin/python" - "$repo" <<'PY'
import pathlib
import sys

import aiodelayq
import aiodelayq._admin
import aiodelayq._consuming
import aiodelayq._contents
import aiodelayq._parts
import aiodelayq._producing
import aiodelayq._recurring
import aiodelayq._util
import aiodelayq._redis
import aiodelayq._runtime
import aiodelayq._wire
import aiodelayq.cli
import aiodelayq.testing
from aiodelayq._scripts import SCRIPTS

where = pathlib.Path(aiodelayq.__file__).resolve()
repo = pathlib.Path(sys.argv[1]).resolve()
assert repo not in where.parents, f"imported from the source tree: {where}"
assert (where.parent / "py.typed").exists(), "py.typed is missing from the wheel"
lua = sorted(p.name for p in (where.parent / "_scripts" / "lua").glob("*.lua"))
assert lua == sorted(f"{s.name}.lua" for s in SCRIPTS), f"the wheel's Lua scripts: {lua}"
assert all("redis.call" in s.text or s.name == "native_long" for s in SCRIPTS)
print(f"aiodelayq {aiodelayq.__version__} from {where.parent}")
PY
"$work/venv/bin/aiodelayq" --version

step "running the demo from the installed package (a throwaway server from the [server] wheels)"
timeout 120 "$work/venv/bin/python" -m aiodelayq.demo --orders 10 --max-delay 1
step "done"
