#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml) with --strict and checks it offline:
#   1. installs the `docs` extra into .venv-docs (with uv, as scripts/test.sh does);
#   2. puts the two JavaScript files the theme names on a CDN into the privacy plugin's cache, from the npm
#      registry at pinned versions, so the built site holds them and no page loads anything from another host;
#   3. `mkdocs build --strict` (a broken link, a missing page or an unknown reference marker fails it);
#   4. serves site/ on loopback and runs scripts/site_browser_check.py (headless chromium): three pages
#      open with no request to another host, and the site search finds "yarn".
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x .venv-docs/bin/uv ]; then
    python3 -m venv .venv-docs
    .venv-docs/bin/pip install -q uv
fi
.venv-docs/bin/uv pip install -q --python .venv-docs/bin/python -e '.[docs,test-core]' 'selenium>=4.20'

cache=.cache/plugin/privacy/assets/external/unpkg.com
fetch() {  # fetch NPM_SPEC FILE_IN_PACKAGE DESTINATION
    [ -s "$3" ] && return
    local tmp; tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$1" >/dev/null && tar xzf ./*.tgz)
    mkdir -p "$(dirname "$3")"
    cp "$tmp/package/$2" "$3"
    rm -rf "$tmp"
}
fetch iframe-worker@1.0.4 shim/index.js "$cache/iframe-worker/shim.js"
ln -sfn shim.js "$cache/iframe-worker/shim"  # the plugin resolves the extension-less URL through a link
fetch mermaid@11.6.0 dist/mermaid.min.js "$cache/mermaid@11/dist/mermaid.min.js"

.venv-docs/bin/mkdocs build --strict --quiet
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || apt-get install -y -q chromium chromium-driver
SE_OFFLINE=true timeout 180 .venv-docs/bin/python scripts/site_browser_check.py site
echo "docs: site built (--strict) and checked offline"
