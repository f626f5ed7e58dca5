#!/bin/sh
# Make a headless Chromium available for the ledger report's browser test
# (tests/ledger/test_report_browser.py): Debian's `chromium` package, installed
# only when no chromium / chromium-browser / google-chrome is on PATH (or at
# $SPARKPRIV_CHROMIUM). Called by .ci/run. In CI (CI=true) the test fails
# rather than skips when no browser is found.
set -eu

found() {
    if [ -n "${SPARKPRIV_CHROMIUM:-}" ] && [ -x "$SPARKPRIV_CHROMIUM" ]; then
        echo "$SPARKPRIV_CHROMIUM"; return 0
    fi
    for name in chromium chromium-browser google-chrome google-chrome-stable; do
        if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    done
    return 1
}

if browser=$(found); then
    echo "chromium.sh: browser present ($browser)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "chromium.sh: installing Debian's chromium package"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

if browser=$(found); then
    echo "chromium.sh: installed ($browser)"
else
    echo "chromium.sh: apt-get installed chromium but no chromium is on PATH" >&2
    exit 1
fi
