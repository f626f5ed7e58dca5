#!/bin/sh
# Make PostgreSQL server binaries available for tests/ledger (Debian/Ubuntu).
#
# The test suite starts its own throwaway server (tests/ledger/conftest.py);
# this script only installs the binaries, and only when no
# /usr/lib/postgresql/*/bin/pg_ctl exists. It creates no cluster and starts
# no service. Called by .ci/run.
set -eu

found() {
    for f in /usr/lib/postgresql/*/bin/pg_ctl; do
        [ -x "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

if pg_ctl=$(found); then
    echo "postgres.sh: PostgreSQL binaries present ($pg_ctl)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "postgres.sh: installing Debian's postgresql packages"
# Debian's postinst would create and start a 'main' cluster; we need neither
# (an existing postgresql-common configuration is left as it is).
if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    $SUDO mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null
fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql

if pg_ctl=$(found); then
    echo "postgres.sh: installed ($pg_ctl)"
else
    echo "postgres.sh: apt-get installed postgresql but no /usr/lib/postgresql/*/bin/pg_ctl exists" >&2
    exit 1
fi
