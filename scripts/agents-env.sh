#!/usr/bin/env bash
# Installs the coding agents the end-to-end tests run inside pvisor, from the
# npm registry at pinned versions, into target/agents (kept between runs):
# Claude Code (a native binary) and Codex (a static binary behind a node
# wrapper). Prints the directory whose bin/ holds `claude` and `codex`.
# Usage: scripts/agents-env.sh [DIR]. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/target/agents}"
claude_version=2.1.332
codex_version=0.171.0
want="claude-code@$claude_version codex@$codex_version"
if [ "$(cat "$dir/.installed" 2>/dev/null)" = "$want" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "agents-env: npm is missing; install it as root (apt-get install nodejs npm)" >&2
    exit 1
  fi
  echo "agents-env: installing nodejs and npm" >&2
  "$(dirname "$0")/apt-install.sh" nodejs npm
fi
echo "agents-env: installing Claude Code $claude_version and Codex $codex_version from npm into $dir" >&2
rm -rf "$dir.new"
mkdir -p "$dir.new"
npm install --prefix "$dir.new" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$claude_version" "@openai/codex@$codex_version" >&2
# The binaries themselves, so a test needs neither node nor npm's wrappers
# (relative links: the directory may move).
mkdir -p "$dir.new/bin"
claude=$(cd "$dir.new" && find node_modules/@anthropic-ai -path '*claude-code-linux-x64/claude' -type f | head -1)
codex=$(cd "$dir.new" && find node_modules/@openai -path '*/vendor/x86_64-unknown-linux-musl/bin/codex' -type f | head -1)
if [ -z "$claude" ] || [ -z "$codex" ]; then
  echo "agents-env: the npm packages did not bring the linux-x64 binaries (claude: '${claude}', codex: '${codex}')" >&2
  exit 1
fi
ln -s "../$claude" "$dir.new/bin/claude"
ln -s "../$codex" "$dir.new/bin/codex"
"$dir.new/bin/claude" --version >/dev/null
"$dir.new/bin/codex" --version >/dev/null
echo "$want" > "$dir.new/.installed"
rm -rf "$dir"
mv "$dir.new" "$dir"
echo "$dir"
