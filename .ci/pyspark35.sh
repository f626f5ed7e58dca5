#!/usr/bin/env bash
# The PySpark 3.5 leg of CI: a second virtual environment with pyspark 3.5,
# then the Spark, cluster, CLI, jobs and synthesis tests in it. Called by .ci/run, which runs it
# beside the 4.x leg's tests.
#
# The environment lives in .ci-local/ (not committed; PYSPARK35_VENV moves it)
# and is rebuilt when pyproject.toml or this script changes. It holds this
# project (editable) and the `test` extra of pyproject.toml, with pyspark
# pinned to 3.5.*. The extra's `pyspark[connect]` entry is left out: pyspark
# 3.5's connect extra pins numpy<2, and its pip package ships no Spark Connect
# server to test against (docs/running.md, "Supported versions"). So this leg runs
# on numpy 2, as `pip install sparkpriv 'pyspark==3.5.*'` gives a user.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python}"   # the interpreter of the 4.x leg
VENV="${PYSPARK35_VENV:-$PWD/.ci-local/venv-pyspark35}"
STAMP="$VENV/.sparkpriv-stamp"
want=$(cat pyproject.toml .ci/pyspark35.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "== PySpark 3.5: creating $VENV"
  t_env=$(date +%s)
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # the test extra without its pyspark entries (read from pyproject.toml: one list of test tools)
  mapfile -t extra < <("$PY" - <<'EOF'
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["optional-dependencies"]["test"]
for d in deps:
    if re.match(r"\s*pyspark\b", d) is None:
        print(d)
EOF
)
  "$VENV/bin/pip" install -q --disable-pip-version-check -e . 'pyspark==3.5.*' "${extra[@]}"
  echo "$want" > "$STAMP"
  echo "== PySpark 3.5: environment created in $(( $(date +%s) - t_env )) s"
fi
"$VENV/bin/python" - <<'EOF'
import numpy, pandas, pyarrow, pyspark, py4j, sys
print(f"== PySpark 3.5 leg: python {sys.version.split()[0]}, pyspark {pyspark.__version__}, "
      f"numpy {numpy.__version__}, pandas {pandas.__version__}, pyarrow {pyarrow.__version__}")
assert pyspark.__version__.startswith("3.5."), pyspark.__version__
EOF

# Spark's Python workers must run on this environment's interpreter (the test
# fixture's session does not choose one; `python3` on PATH has pyspark 4).
export PYSPARK_PYTHON="$VENV/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
unset PYTHONPATH SPARK_HOME
# its own pytest base directory: the 4.x leg's pytest runs at the same time (.ci/run)
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/sparkpriv-pyspark35-XXXXXX")
start=$(date +%s)
set +e
# tests marked main_leg exercise Spark's process handling (killed workers and drivers), a
# harness (the benchmarks but one), or an end-to-end run of pieces this leg tests one by
# one (the demos, the command line's generate-release-job run): the 4.x leg runs them
"$VENV/bin/python" -m pytest -p no:cacheprovider --basetemp "$basetemp" -m "not main_leg" tests/spark tests/cluster tests/deploy \
  tests/test_cli.py tests/test_synthesize.py "$@"
rc=$?
set -e
if [ "$rc" -eq 0 ]; then rm -rf "$basetemp"; fi  # kept for a look when a test failed
echo "== PySpark 3.5 tests took $(( $(date +%s) - start )) s, exit code $rc"
if [ "$rc" -eq 5 ]; then
  echo "PySpark 3.5 leg: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
