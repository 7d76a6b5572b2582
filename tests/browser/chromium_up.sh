#!/usr/bin/env bash
# Headless Chromium for tests/test_report_browser.py and scripts/screenshot_report.sh (`make test` runs this first):
#   sudo bash tests/browser/chromium_up.sh   # install Debian's chromium when no Chromium is on PATH
# Nothing else is downloaded: the tests drive the browser over its DevTools pipe (src/r2m/reports/browser.py).
# Exit 0: a Chromium is there ("found PATH" or "installed PATH" on stdout); otherwise one line on stderr, exit 2.
set -uo pipefail
die() { echo "chromium_up: $*" >&2; exit 2; }
find_browser() {
    if [[ -n ${R2M_CHROMIUM:-} ]]; then command -v "$R2M_CHROMIUM"; return; fi
    command -v chromium || command -v chromium-browser || command -v google-chrome || command -v google-chrome-stable
}
if browser=$(find_browser); then echo "found $browser"; exit 0; fi
[[ $(id -u) == 0 ]] || die "no Chromium on PATH; install it as root: apt-get install -y chromium (or run make test-fast, which skips the browser test)"
command -v apt-get >/dev/null || die "no Chromium on PATH and no apt-get: install Chromium yourself (or set R2M_CHROMIUM)"
log=${TMPDIR:-/tmp}/r2m-chromium-apt.log
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    >"$log" 2>&1 || die "apt-get install chromium failed (log: $log)"
browser=$(find_browser) || die "apt-get installed chromium but no Chromium is on PATH (log: $log)"
echo "installed $browser"
