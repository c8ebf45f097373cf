#!/usr/bin/env bash
# tests/explain/run_browser_test.sh MULTIHEAD WORKDIR
#
# The ctest `explain_browser`: installs what it needs, writes the report for
# the lesson's sentence and runs browser_test.mjs on it.
#  - Debian's chromium, nodejs and npm come from scripts/install-deps.sh
#    (the test group); missing, they are a failure that says so.
#  - playwright-core, at the version and hash of package-lock.json beside
#    this script, is installed with `npm ci` into WORKDIR/../explain-node
#    (once per build folder; again when the lock changes). No browser is
#    downloaded: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1, and the test launches
#    /usr/bin/chromium.
# The screenshots land in WORKDIR/explain-report.png and explain-trained.png.
set -euo pipefail
cli=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
data=$(cd "$here/../data/explain" && pwd)

for tool in /usr/bin/chromium node npm; do
  command -v "$tool" >/dev/null || { echo "explain_browser: $tool is missing; run scripts/install-deps.sh (as root)" >&2; exit 1; }
done

node_dir=$(dirname "$work")/explain-node
if ! cmp -s "$here/package-lock.json" "$node_dir/package-lock.json" ||
   [[ ! -f $node_dir/node_modules/playwright-core/package.json ]]; then
  rm -rf "$node_dir"
  mkdir -p "$node_dir"
  cp "$here/package.json" "$here/package-lock.json" "$node_dir/"
  echo "explain_browser: npm ci (playwright-core, as package-lock.json pins it) into $node_dir"
  # npm trusts only the roots bundled with Node.js; add the system's store
  # (ca-certificates), which also holds any authority the local network adds.
  ca=()
  if [[ -z ${NODE_EXTRA_CA_CERTS:-} && -f /etc/ssl/certs/ca-certificates.crt ]]; then
    ca=(env NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt)
  fi
  (cd "$node_dir" && "${ca[@]}" env PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

rm -rf "$work"
mkdir -p "$work"
"$cli" explain --weights "$data/w.safetensors" --input "$data/x.npy" \
  --tokens "The animal didn't cross the street because it was too tired" --out "$work/report.html"
# The default report: the shipped trained model on the lesson's sentence.
"$cli" explain --out "$work/trained.html"
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 node "$here/browser_test.mjs" --report "$work/report.html" \
  --trained "$work/trained.html" \
  --node-modules "$node_dir/node_modules" --work "$work" --chromium /usr/bin/chromium
