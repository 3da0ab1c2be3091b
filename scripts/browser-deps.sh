#!/usr/bin/env bash
# browser-deps.sh: what the web console's browser test
# (services/console/browser_test.go) needs beyond Go, installed when
# missing and possible:
#   - Debian's chromium (apt-get, as root): the browser the test drives.
#     Never a browser download (npx playwright install is not used).
#   - playwright-core and axe-core, pinned by the committed
#     services/console/browser/package-lock.json, npm ci'd into
#     ${NEURON_CACHE:-$HOME/.cache/neuron}/console-browser (outside the
#     repo), again whenever the lockfile changes.
# Idempotent. It never fails: what it cannot install is printed, and the
# test skips with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."

cache="${NEURON_CACHE:-$HOME/.cache/neuron}"
dest="$cache/console-browser"
src=services/console/browser

# quiet runs a command, showing its output only when it fails.
quiet() {
  local log rc
  log=$(mktemp)
  "$@" >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || cat "$log" >&2
  rm -f "$log"
  return $rc
}

if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "browser-deps: installing chromium"
    quiet apt-get update -qq && DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends chromium \
      || echo "browser-deps: apt-get install chromium failed; the console's browser test will skip"
  else
    echo "browser-deps: chromium missing and cannot be installed here (needs root and apt-get); the console's browser test will skip"
  fi
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "browser-deps: npm missing; the console's browser test will skip"
  exit 0
fi
if ! cmp -s "$src/package-lock.json" "$dest/package-lock.json" || ! [ -d "$dest/node_modules/playwright-core" ]; then
  mkdir -p "$dest"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  (cd "$dest" && quiet npm ci --ignore-scripts --no-audit --no-fund) \
    || echo "browser-deps: npm ci of playwright-core and axe-core failed; the console's browser test will skip"
fi
exit 0
