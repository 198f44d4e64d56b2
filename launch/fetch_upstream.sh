#!/usr/bin/env bash
# Fills the ignored folder third_party/mamba/ with upstream mamba_ssm's Python source (the Triton
# kernels the device check times beside ours): launch/fetch_upstream.sh GIT_DIR [DEST]
#   GIT_DIR  a git directory of github.com/state-spaces/mamba: a bare mirror (e.g. from
#            `git clone --bare https://github.com/state-spaces/mamba mamba.git`) or a clone's .git
#   DEST     default third_party/mamba (ignored by git: nothing upstream is committed)
# REV=<commit or ref> exports another revision (default HEAD). Writes DEST/mamba_ssm, DEST/LICENSE,
# DEST/COMMIT (the exported commit) and DEST/deps/: copies of einops and packaging, pure-Python
# imports of mamba_ssm's Triton modules that an accelerator machine's python may lack (from the
# project venv, or the python on PATH; the device check puts deps/ last on sys.path, so an
# installed copy wins). Nothing here runs upstream code.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: launch/fetch_upstream.sh GIT_DIR [DEST]   (GIT_DIR: a git directory of state-spaces/mamba)" >&2
  exit 2
fi
git_dir=$1
dest=${2:-third_party/mamba}
rev=${REV:-HEAD}
if ! commit=$(git --git-dir="$git_dir" rev-parse --verify --quiet "$rev^{commit}"); then
  echo "fetch_upstream: '$git_dir' has no commit '$rev'; expected a git directory of state-spaces/mamba" >&2
  exit 1
fi
if ! git --git-dir="$git_dir" cat-file -e "$commit:mamba_ssm/ops/triton/ssd_combined.py" 2>/dev/null; then
  echo "fetch_upstream: $commit in '$git_dir' has no mamba_ssm/ops/triton/ssd_combined.py; expected state-spaces/mamba" >&2
  exit 1
fi
rm -rf "$dest/mamba_ssm" "$dest/deps"
mkdir -p "$dest/deps"
git --git-dir="$git_dir" archive "$commit" mamba_ssm LICENSE | tar -x -C "$dest"
echo "$commit" > "$dest/COMMIT"
py=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
for mod in einops packaging; do
  src=$("$py" -c "import os, $mod; print(os.path.dirname($mod.__file__))" 2>/dev/null) || {
    echo "fetch_upstream: $py has no '$mod'; the device's python must provide it" >&2; continue; }
  cp -r "$src" "$dest/deps/$mod"
  find "$dest/deps/$mod" -name __pycache__ -prune -exec rm -rf {} +
done
echo "fetch_upstream: mamba_ssm at $commit in $dest ($(find "$dest" -name '*.py' | wc -l) Python files)"
