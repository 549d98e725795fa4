#!/usr/bin/env bash
# CI, the container run: the suite once more with its session server a testcontainers Redis, then one
# quick benchmark scenario against one (docs/containers.md).
#
#   bash .ci/containers.sh [PYTHON]
#
# PYTHON runs pytest and the benchmarks (default: .nox/tests/bin/python if present, else python3). The
# image is $AIODELAYQ_DOCKER_IMAGE (default aiodelayq-redis:7), built here FROM scratch out of Debian's
# redis-server, since no image registry is reachable. With no Docker engine (none running, and none that
# this script can install and start as root), it prints one `note:` line and exits 0; a failing suite or
# benchmark fails it. A dockerd it started is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${AIODELAYQ_DOCKER_IMAGE:-aiodelayq-redis:7}"
if [ -n "${1:-}" ]; then
  PY="$1"
elif [ -x .nox/tests/bin/python ]; then
  PY=.nox/tests/bin/python
else
  PY=python3
fi
OUT=/tmp/aiodelayq-containers  # logs and benchmark results: outside the work tree
mkdir -p "$OUT"
DOCKERD_LOG="$OUT/dockerd.log"
HEARTBEAT_S=15

say() { echo "== containers: $*"; }

skip() {
  echo "note: no Docker engine: the container run is skipped ($1)"
  exit 0
}

# Every step's time, for the closing summary.
TIMES=()
STEP_START=0
step() {
  STEP_NAME="$1"
  STEP_START=$(date +%s.%N)
  say "$1"
}
step_done() {
  local took
  took=$(awk -v a="$STEP_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  TIMES+=("$STEP_NAME: ${took} s${1:+ ($1)}")
  say "$STEP_NAME: done in ${took} s${1:+ ($1)}"
}

# quiet LOG CMD...: run CMD with its output in LOG, printing its latest line every HEARTBEAT_S seconds so
# a long install is never silent; returns CMD's status. CMD brings its own bound (timeout).
quiet() {
  local log="$1" pid start
  shift
  "$@" >"$log" 2>&1 &
  pid=$!
  start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    # A bounded poll: one second at a time, so the step ends as soon as CMD does.
    for _ in $(seq "$HEARTBEAT_S"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "   ... $((SECONDS - start)) s: $(tail -n 1 "$log" | tr -d '\r' | cut -c 1-100)"
    fi
  done
  wait "$pid"
}

engine_answers() { timeout 15 docker info >/dev/null 2>&1; }

DOCKERD_PID=""
BUILD_DIR=""
cleanup() {
  local status=$?
  if [ -n "$BUILD_DIR" ]; then rm -rf "$BUILD_DIR"; fi
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    say "stopping the dockerd this script started (pid $DOCKERD_PID)"
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    # dockerd stops its containers and its containerd first: give it 30 s, then no more.
    for _ in $(seq 30); do
      kill -0 "$DOCKERD_PID" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
      echo "note: dockerd did not stop within 30 s: killed"
      kill -KILL "$DOCKERD_PID" 2>/dev/null || true
    fi
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "image $IMAGE, python $PY, logs in $OUT"
# Checked first: a Python without the test extras is a broken setup, not a missing engine.
if ! "$PY" -c "import testcontainers, pytest" 2>/dev/null; then
  echo "error: $PY has no testcontainers or pytest (pip install -e '.[test]')"
  exit 1
fi

# -- 1. a Docker engine: the one running, or Debian's docker.io installed and started here -------------------

if engine_answers; then
  say "a Docker engine answers already: using it"
else
  if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
      skip "dockerd is not installed and installing it needs root and apt-get"
    fi
    step "installing docker.io"
    # The lock timeout: another install (.ci/run's) may hold dpkg's lock for a while.
    apt_install=(timeout 600 apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=120 docker.io)
    if ! quiet "$OUT/apt.log" "${apt_install[@]}"; then
      say "the install failed: updating the package lists and trying once more"
      quiet "$OUT/apt-update.log" timeout 180 apt-get update -q || true
      quiet "$OUT/apt.log" "${apt_install[@]}" || skip "apt-get install docker.io failed: $(tail -n 1 "$OUT/apt.log")"
    fi
    command -v dockerd >/dev/null 2>&1 || skip "docker.io installed no dockerd"
    step_done
  fi
  # A service the install may have started (where no policy-rc.d forbids it) would be one this script
  # cannot tell apart from a user's: stop it and start a dockerd of this script's own.
  if engine_answers; then
    (timeout 60 service docker stop >/dev/null 2>&1 || true)
  fi
  step "starting dockerd"
  # setsid: dockerd's own session, so a Ctrl-C at the terminal reaches this script, which stops it.
  setsid dockerd >"$DOCKERD_LOG" 2>&1 &
  DOCKERD_PID=$!
  ready=""
  for second in $(seq 60); do
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
      DOCKERD_PID=""
      skip "dockerd exited at start: $(grep -v '^\s*$' "$DOCKERD_LOG" | tail -n 1 | cut -c 1-200)"
    fi
    if timeout 5 docker info >/dev/null 2>&1; then
      ready=1
      break
    fi
    if [ $((second % HEARTBEAT_S)) = 0 ]; then echo "   ... ${second} s: no answer from dockerd yet"; fi
    sleep 1
  done
  [ -n "$ready" ] || skip "dockerd did not answer within 60 s (its log: $DOCKERD_LOG)"
  step_done "$(docker version --format 'engine {{.Server.Version}}' 2>/dev/null || echo 'engine up')"
fi

# -- 2. the image: Debian's redis-server, its libraries and the loader, FROM scratch ---------------------------

step "building image $IMAGE"
REDIS_SERVER=$(command -v redis-server || true)
[ -n "$REDIS_SERVER" ] || { echo "error: no redis-server to build the image from (apt-get install redis-server)"; exit 1; }
BUILD_DIR=$(mktemp -d /tmp/aiodelayq-redis-image.XXXXXX)
cp .ci/redis-image/Dockerfile "$BUILD_DIR/"
ROOTFS="$BUILD_DIR/rootfs"
mkdir -p "$ROOTFS/usr/bin"
# -L: Debian's redis-server is a link to redis-check-rdb, and the binary picks its role from its name,
# so the file in the image must be called redis-server.
cp -L "$REDIS_SERVER" "$ROOTFS/usr/bin/redis-server"
# Every library ldd resolves ("name => /path (addr)") and the loader ("/lib64/ld-linux-x86-64.so.2 (addr)"),
# each as a real file at the path the binary asks for (-L: the image has no links to follow).
mapfile -t LIBS < <(ldd "$REDIS_SERVER" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ "${#LIBS[@]}" -gt 0 ] || { echo "error: ldd listed no library for $REDIS_SERVER"; exit 1; }
for lib in "${LIBS[@]}"; do
  mkdir -p "$ROOTFS$(dirname "$lib")"
  cp -L "$lib" "$ROOTFS$lib"
done
echo "   redis-server $("$REDIS_SERVER" --version | awk '{ print $3 }') and ${#LIBS[@]} libraries (loader included)"
# DOCKER_BUILDKIT=0: the classic builder is enough for COPY into scratch and needs no buildx plugin (its
# deprecation notice goes to the log with the rest).
if ! DOCKER_BUILDKIT=0 timeout 300 docker build -t "$IMAGE" "$BUILD_DIR" >"$OUT/build.log" 2>&1; then
  tail -n 20 "$OUT/build.log"
  say "building the image FAILED"
  exit 1
fi
# The image must start a server by itself: a missing library shows here, not as a suite of errors.
timeout 60 docker run --rm "$IMAGE" /usr/bin/redis-server --version
SIZE=$(docker image inspect -f '{{.Size}}' "$IMAGE")
step_done "$((SIZE / 1024 / 1024)) MiB, $SIZE bytes"

# -- 3. the suite through testcontainers, once ----------------------------------------------------------------

step "suite through testcontainers (AIODELAYQ_SERVER=docker, image $IMAGE)"
# Ryuk, testcontainers' reaper, is an image it would pull: off; the fixture stops its own container.
# The modules of the queue's calls: what checks the testcontainers path (the server kinds' runs check
# the rest against the same Redis 7.0).
MODULES=(tests/test_offer.py tests/test_take.py tests/test_reliable.py tests/test_keys.py tests/test_pending.py)
rc=0
TESTCONTAINERS_RYUK_DISABLED=true AIODELAYQ_SERVER=docker AIODELAYQ_DOCKER_IMAGE="$IMAGE" \
  timeout 2400 "$PY" -m pytest -m "not slow and not java and not topology and not once" -q -p no:cacheprovider "${MODULES[@]}" \
  || rc=$?
if [ "$rc" != 0 ]; then
  say "the suite through testcontainers FAILED (exit $rc)"
  exit "$rc"
fi
step_done

# -- 4. the quick benchmarks against a container --------------------------------------------------------------

# One scenario: the --docker path of the benchmarks works (the figures of record, and the ratio checks,
# come from the native runs).
step "benchmarks --docker --quick --only offer"
rc=0
TESTCONTAINERS_RYUK_DISABLED=true timeout 1200 "$PY" benchmarks/run.py --docker --docker-image "$IMAGE" --quick \
  --only offer --out-dir "$OUT/bench" || rc=$?
if [ "$rc" != 0 ]; then
  say "the benchmarks against a container FAILED (exit $rc)"
  exit "$rc"
fi
step_done "results in $OUT/bench"

say "timings:"
for line in "${TIMES[@]}"; do echo "   $line"; done
