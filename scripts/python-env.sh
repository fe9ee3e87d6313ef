#!/usr/bin/env bash
# Creates (once) the Python environment the end-to-end tests decode records with, and prints
# its interpreter's path. The environment lives outside the repository, in
# ${SIPHON_CACHE_DIR:-~/.cache/siphon}/py-<hash of tests/python/requirements.txt>, so a changed requirements file
# gets a fresh one and an unchanged one is reused.
#
# Exit status: 0 with the interpreter path on stdout; 3 when python3 is not installed (the
# tests skip); anything else is a failure to build the environment.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$here/tests/python/requirements.txt"
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is not installed" >&2
    exit 3
fi
hash="$(sha256sum "$requirements" | cut -c1-16)"
cache="${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}"
venv="$cache/py-$hash"
mkdir -p "$cache"
if [ ! -x "$venv/.ready" ]; then
    # Tests start in parallel: one builds, the others wait and reuse.
    exec 9>"$cache/py-$hash.lock"
    flock 9
fi
if [ ! -x "$venv/.ready" ]; then
    # Build beside the final path and rename, so a concurrent or interrupted run never
    # leaves a half-made environment behind under the final name.
    staging="$(mktemp -d "$cache/py-$hash.XXXXXX")"
    python3 -m venv "$staging" >&2
    "$staging/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
    touch "$staging/.ready" && chmod +x "$staging/.ready"
    if ! mv -T "$staging" "$venv" 2>/dev/null; then
        rm -rf "$staging"
    fi
fi
echo "$venv/bin/python"
