#!/usr/bin/env bash
# Builds, or reuses, the test environment of one engine:   tests/engines/setup.sh sglang|vllm|vllm-0.34
# (the key names an engine release: vllm is the 0.33 tier, vllm-0.34 the vLLM 0.34 tier)
#
# One venv per engine (their pins conflict): torch 2.13.0 (CPU) first, then the pinned
# requirement file tests/engines/requirements-ENGINE.txt with --no-deps (every package the
# engine tier needs is pinned there, the engine wheel included: nothing is resolved), the
# stand-ins of tests/engines/stubs/ for packages that cannot install on a CPU-only machine,
# and attnhal itself, editable. The environment lives outside the clone so that a fresh
# clone (CI) reuses it:
#     ${ATTNHAL_ENGINE_ENVS:-~/.cache/attnhal/engine-envs}/ENGINE-HASH
# HASH covers this script, the requirement file, the stand-ins and the Python: a change to any
# of them builds a new environment. A change to attnhal's entry-point tables only reinstalls
# attnhal (editable, seconds) so that its plugins are registered. The stamp file is written last,
# so a build that was killed is never reused; a lock keeps two processes from building at once.
# Setup may use the package index; the tests run in the environment may not use the network.
# The environment's path is the last line printed.
set -euo pipefail

engine=${1:-}
case "$engine" in
  sglang|vllm|vllm-0.34) ;;
  *) echo "engine=${engine:-<missing>} (supported: sglang, vllm, vllm-0.34)" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
requirements=$here/requirements-$engine.txt
python=${ATTNHAL_ENGINE_PYTHON:-python3}

entry_points() {  # the [project.entry-points.*] tables of pyproject.toml (the plugins attnhal registers)
  awk '/^\[/{keep = ($0 ~ /^\[project\.entry-points/)} keep' "$repo/pyproject.toml"
}

hash=$( { cat "$here/setup.sh" "$requirements"; find "$here/stubs" -type f -name '*.py' | sort | xargs cat;
          "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
plugins=$(entry_points | sha256sum | cut -c1-16)
root=${ATTNHAL_ENGINE_ENVS:-$HOME/.cache/attnhal/engine-envs}
env=$root/$engine-$hash
stamp=$env/attnhal-engine-env.stamp
mkdir -p "$root"

exec 9>"$root/$engine.lock"
flock 9

install_attnhal() {  # attnhal, editable: its entry points (plugins) registered in the engine's environment
  "$env/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$repo"
  echo "$plugins" > "$env/attnhal-plugins.stamp"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  if [ "$(cat "$env/attnhal-plugins.stamp" 2>/dev/null)" != "$plugins" ]; then
    echo "engine env: attnhal's entry points changed: reinstalling attnhal in $env" >&2
    install_attnhal >> "$env.log" 2>&1 || { echo "engine env: reinstall failed, see $env.log" >&2; exit 1; }
  fi
  echo "engine env: reusing $env" >&2
  echo "$env"
  exit 0
fi

echo "engine env: building $env (a few minutes; pip output in $env.log)" >&2
start=$(date +%s)
rm -rf "$env"
{
  "$python" -m venv "$env"
  pip=("$env/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" --no-deps -r "$requirements"
  site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # Stand-ins: importable packages, and a distribution record for torchvision (transformers
  # reads its version through importlib.metadata). See stubs/_attnhal_stub.py.
  cp "$here/stubs/_attnhal_stub.py" "$site/"
  for package in "$here"/stubs/*/; do
    cp -r "$package" "$site/"
  done
  record=$site/torchvision-0.0.0+attnhal.stub.dist-info
  mkdir -p "$record"
  printf 'Metadata-Version: 2.1\nName: torchvision\nVersion: 0.0.0+attnhal.stub\n' > "$record/METADATA"
  echo pip > "$record/INSTALLER"
  : > "$record/RECORD"
  # The tier runs with the current clone first on PYTHONPATH, so a reused environment built
  # from another clone still tests the code of this one.
  install_attnhal
} > "$env.log" 2>&1 || { echo "engine env: build failed, last lines of $env.log:" >&2; tail -20 "$env.log" >&2; exit 1; }

echo "$hash" > "$stamp"
# Older environments of this engine (other pins) are removed once the new one is complete.
# Only ENGINE-HASH (16 hex digits): "vllm-*" must not take the vllm-0.34 environments.
for old in "$root/$engine"-*; do
  case "${old#"$root/$engine"-}" in
    ????????????????|????????????????.log) ;;
    *) continue ;;
  esac
  if [ "$old" != "$env" ] && [ "$old" != "$env.log" ]; then rm -rf "$old"; fi
done
echo "engine env: built in $(( $(date +%s) - start )) s" >&2
echo "$env"
