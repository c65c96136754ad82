#!/bin/bash
# A throwaway PostgreSQL server on 127.0.0.1, for tests and for trying a sweep on a shared study:
#   scripts/engines/postgres.sh start      prints: <folder> <URL> (user kiln, password kiln, database kiln)
#   scripts/engines/postgres.sh stop <folder>
# kiln sweep ... --storage <URL> (its driver: make add PKG='psycopg[binary]'). As root it runs the server as the
# postgres user (or nobody): PostgreSQL refuses root. With KILN_INSTALL_ENGINES=1 (or CI=true), as root, it
# installs it with apt-get where it is missing. Exit 3: no PostgreSQL server here.
set -euo pipefail
if ! command -v initdb > /dev/null && ! ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 \
  && [ "${KILN_INSTALL_ENGINES:-0}" = 1 -o "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql > /dev/null 2>&1 || true
fi
bin=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1)")")
if [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ]; then
  echo "no PostgreSQL server here (initdb, pg_ctl): apt-get install postgresql, or brew install postgresql" >&2
  exit 3
fi
as=()
if [ "$(id -u)" = 0 ]; then
  user=$(id -u postgres >/dev/null 2>&1 && echo postgres || echo nobody)
  as=(runuser -u "$user" --)
fi
case "${1:-}" in
  start)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-postgres.XXXXXX")
    [ ${#as[@]} -eq 0 ] || chown "$user" "$dir"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo kiln > "$dir/pw"
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U kiln --pwfile "$dir/pw" --auth-local trust --auth-host scram-sha-256 \
      > "$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-h 127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=50" start > /dev/null \
      || { cat "$dir/server.log" >&2; exit 1; }
    "${as[@]}" "$bin/createdb" -h "$dir" -p "$port" -U kiln kiln
    echo "$dir postgresql+psycopg://kiln:kiln@127.0.0.1:$port/kiln"
    ;;
  stop)
    dir=${2:?usage: $0 stop <folder>}
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop > /dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start | stop <folder>" >&2
    exit 2
    ;;
esac
