# Sourced by scripts/test: make sure PostgreSQL and RabbitMQ answer on loopback (starting them if
# not), and that redis-server is installed (the tests start a Redis of their own on a free port;
# on RabbitMQ they make a virtual host of their own and delete it).
# The start commands are this machine kind's own (Debian packages, no systemd).

answers() { # host port
  timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

wait_for() { # name port
  for _ in $(seq 1 60); do
    answers 127.0.0.1 "$2" && return 0
    sleep 0.5
  done
  echo "$1 does not answer on 127.0.0.1:$2 after 30 s" >&2
  return 1
}

ensure_postgres() {
  answers 127.0.0.1 5432 && return 0
  echo "PostgreSQL is not answering on 127.0.0.1:5432: starting it" >&2
  if ! command -v pg_ctlcluster >/dev/null; then
    echo "PostgreSQL is not installed (apt-get install postgresql)" >&2
    return 1
  fi
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  wait_for PostgreSQL 5432
}

ensure_rabbitmq() {
  answers 127.0.0.1 5672 && return 0
  echo "RabbitMQ is not answering on 127.0.0.1:5672: starting it" >&2
  if ! command -v rabbitmq-server >/dev/null; then
    echo "RabbitMQ is not installed (apt-get install rabbitmq-server)" >&2
    return 1
  fi
  rabbitmq-server -detached
  wait_for RabbitMQ 5672
}

require_redis_server() {
  command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] && return 0
  echo "redis-server is not installed (apt-get install redis-server): the tests start their own" >&2
  return 1
}

# A program from a Debian package, installed once when missing (--no-install-recommends: the
# package's daemon and its exporters are not wanted; the tests start their own on free ports).
# Used for pgbouncer (the store through a pooler in transaction mode) and prometheus (promtool
# and a real Prometheus scraping the processes a test starts).
ensure_debian_program() {
  local program="$1" package="$2"
  command -v "$program" >/dev/null || [ -x "/usr/sbin/$program" ] && return 0
  echo "$program is not installed: installing Debian's package $package for the tests" >&2
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$package" >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$package" >/dev/null; } \
    || { echo "could not install $package (apt-get install $package)" >&2; return 1; }
}

# Debian's Chromium, which Playwright drives in the dashboard's browser test (no browser download:
# the machine's network reaches the package mirrors only). Installed once, when missing.
ensure_chromium() {
  command -v chromium >/dev/null && return 0
  echo "chromium is not installed: installing Debian's package for the browser test (about a minute)" >&2
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null; } \
    || { echo "could not install chromium (apt-get install chromium)" >&2; return 1; }
}
