#!/usr/bin/env bash
# The guide's screenshot of the report (docs/guide/img/report_claims.png): the Claims section of reports/index.html
# as headless Chromium shows it at 1280 px, through the driver the report's browser test uses
# (src/r2m/reports/browser.py: the DevTools protocol on a pipe; nothing downloaded, works offline).
# usage: scripts/screenshot_report.sh [PAGE=reports/index.html] [OUT=docs/guide/img/report_claims.png]
#                                     [WIDTH=1280] [ELEMENT=#claims ("" = the whole page)]
# Needs chromium (Debian/Ubuntu: apt-get install -y chromium; or run tests/browser/chromium_up.sh as root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
page=${1:-$root/reports/index.html}
out=${2:-$root/docs/guide/img/report_claims.png}
width=${3:-1280}
element=${4-#claims}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || { echo "screenshot_report: $python not found (run: make setup)" >&2; exit 2; }
exec "$python" -m r2m.reports.browser "$page" "$out" --width "$width" ${element:+--element "$element"}
