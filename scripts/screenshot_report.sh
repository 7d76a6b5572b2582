#!/usr/bin/env bash
# Screenshot reports/index.html with headless Chromium (a visual check; not part of the tests).
# usage: scripts/screenshot_report.sh [PAGE=reports/index.html] [OUT=reports/index.png] [WIDTHxHEIGHT=1280x2000]
# Needs chromium (Debian/Ubuntu: apt-get install -y chromium). Works offline; fetches nothing.
set -euo pipefail
page=${1:-reports/index.html}
out=${2:-reports/index.png}
size=${3:-1280x2000}
[ -f "$page" ] || { echo "screenshot_report: $page not found (run: r2m report)" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "screenshot_report: chromium not found (apt-get install -y chromium)" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
abs_page=$(cd "$(dirname "$page")" && pwd)/$(basename "$page")
abs_out=$(mkdir -p "$(dirname "$out")" && cd "$(dirname "$out")" && pwd)/$(basename "$out")
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --screenshot="$abs_out" \
  --window-size="${size/x/,}" "file://$abs_page" >/dev/null 2>&1
echo "wrote $out"
