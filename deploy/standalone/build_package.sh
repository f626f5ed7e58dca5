#!/usr/bin/env bash
# Build the shippable sparkpriv package for a Spark cluster.
#
#   deploy/standalone/build_package.sh [--venv] [OUTDIR]      (OUTDIR defaults to ./dist)
#
# Always writes
#   OUTDIR/sparkpriv-<version>-py3-none-any.whl   the wheel (pip install it where the driver runs)
#   OUTDIR/sparkpriv.zip                          the same wheel under a .zip name, for --py-files
#                                                 (PySpark puts only .zip/.egg/.jar py-files on the
#                                                 executors' sys.path; sparkpriv is pure Python, so
#                                                 Python imports it straight from the zip)
# With --venv it also writes
#   OUTDIR/sparkpriv-env.tar.gz                   a packed virtual environment (Python, sparkpriv and
#                                                 all its dependencies) for --archives ...#env, made
#                                                 with venv-pack; build it on the same OS/CPU
#                                                 architecture and Python minor version as the nodes.
#
# The build runs from a temporary copy of the sources, so the repository gets no build/ or
# *.egg-info directories. Needs python3 >= 3.10 and network access to PyPI (build requirements, and
# the dependencies for --venv). The cluster tests (tests/cluster/) build with this script.
set -euo pipefail

VENV=0
if [[ "${1:-}" == "--venv" ]]; then VENV=1; shift; fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$REPO/dist}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/src"
cp "$REPO/pyproject.toml" "$REPO/README.md" "$TMP/src/"
(cd "$REPO" && tar --exclude='__pycache__' --exclude='*.pyc' --exclude='*.egg-info' -cf - sparkpriv) \
    | (cd "$TMP/src" && tar -xf -)

rm -f "$OUT"/sparkpriv-*.whl "$OUT/sparkpriv.zip"
"$PYTHON" -m pip wheel --no-deps --quiet "$TMP/src" -w "$OUT"
WHEEL="$(ls "$OUT"/sparkpriv-*.whl)"
cp "$WHEEL" "$OUT/sparkpriv.zip"
echo "wheel:      $WHEEL"
echo "py-files:   $OUT/sparkpriv.zip"

if [[ "$VENV" == 1 ]]; then
    "$PYTHON" -m venv "$TMP/env"
    "$TMP/env/bin/pip" install --quiet --upgrade pip
    "$TMP/env/bin/pip" install --quiet "$WHEEL" venv-pack
    "$TMP/env/bin/venv-pack" --quiet -p "$TMP/env" -o "$OUT/sparkpriv-env.tar.gz" --force
    echo "archive:    $OUT/sparkpriv-env.tar.gz  (use --archives $OUT/sparkpriv-env.tar.gz#env)"
fi
