#!/usr/bin/env bash
# Installs the official MCP Python SDK (unchanged, from PyPI) into a
# virtualenv, target/mcp-venv: tests/mcp/client.py drives `pvisor mcp` with it.
# Usage: scripts/mcp-env.sh [VENV_DIR]; prints the venv's python. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec "$root/scripts/python-venv.sh" "${1:-$root/target/mcp-venv}" "mcp==2.3.0"
