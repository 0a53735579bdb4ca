#!/usr/bin/env bash
# Builds the built-in root filesystems of `pvisor serve` sandboxes from
# Debian packages, offline but for the Debian mirror:
#   default  dash as /bin/sh, bash, coreutils, grep, sed, findutils, setpriv
#            (util-linux; commands with uid/gid need it), the libraries they
#            load, and static busybox for ps, vi and other extras
#   python   all of default, plus python3, pip, venv, git, curl, procps and
#            CA certificates, with their whole dependency closure (apt
#            resolves it against an empty package database)
#   code-interpreter  all of python, plus a JDK with jshell, Go, node and
#            TypeScript: the interpreters of java, go and typescript code
#            contexts (about 1 GB)
# Usage: scripts/sandbox-image.sh [OUT_DIR]   (default: target)
# Writes OUT_DIR/sandbox-image/rootfs and OUT_DIR/sandbox-image-NAME/rootfs;
# `pvisor serve` imports `default` when it starts and the others when a
# sandbox first asks for them. Idempotent: rebuilds only when this script changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target}"
"$root/scripts/setup.sh"
stamp="$(b3sum --no-names "$0")"

base=(libc6 libgcc-s1 libselinux1 libpcre2-8-0 libacl1 libattr1 libtinfo6 libgmp10 libcrypt1
  dash bash coreutils grep sed findutils busybox-static util-linux libcap-ng0)
extra=(python3 python3-pip python3-venv git curl ca-certificates procps less)
interpreters=(openjdk-17-jdk-headless golang-go nodejs node-typescript)

# download DIR PKG...: the packages themselves (no dependencies).
download() {
  local debs="$1"; shift
  local missing=()
  for pkg in "$@"; do
    ls "$debs/${pkg}"_*.deb >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null 2>&1) || {
    apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null)
  }
}

# download_closure DIR PKG...: the packages and everything they depend on,
# as if nothing were installed (an empty dpkg status), without recommends.
download_closure() {
  local debs="$1"; shift
  local status; status="$(mktemp)"
  local args=(-q -y --no-install-recommends --download-only -o "Dir::State::status=$status"
    -o "Dir::Cache::archives=$debs" -o Debug::NoLocking=1)
  mkdir -p "$debs/partial"
  apt-get "${args[@]}" install "$@" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get "${args[@]}" install "$@" >/dev/null
  }
  rm -f "$status"
}

# finish ROOTFS NAME PRETTY: the files every image has (users, mount points).
finish() {
  local fs="$1" id="$2" pretty="$3"
  rm -rf "$fs/usr/share/doc" "$fs/usr/share/man" "$fs/usr/share/info" "$fs/usr/share/locale" "$fs/usr/share/lintian"
  ln -sfn dash "$fs/bin/sh"
  # Applets the Debian packages do not provide (ps, vi, less, ...).
  mkdir -p "$fs/usr/local/bin"
  for applet in ps top vi less more wget tar gzip gunzip xz unxz which hostname free uptime; do
    [ -e "$fs/bin/$applet" ] || [ -e "$fs/usr/bin/$applet" ] || ln -sfn /bin/busybox "$fs/usr/local/bin/$applet"
  done
  mkdir -p "$fs/etc" "$fs/root" "$fs/tmp" "$fs/home" "$fs/var/tmp" "$fs/proc" "$fs/dev" "$fs/sys" "$fs/run"
  chmod 1777 "$fs/tmp" "$fs/var/tmp"
  chmod 700 "$fs/root"
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$fs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"
  printf 'PRETTY_NAME="%s"\nID=%s\n' "$pretty" "$id" >"$fs/etc/os-release"
}

# default: the listed packages only, kept small.
debs="$out/sandbox-debs"
mkdir -p "$debs"
download "$debs" "${base[@]}"
dir="$out/sandbox-image"
if ! { [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -x "$dir/rootfs/bin/sh" ]; }; then
  work="$dir.partial"
  rm -rf "$work"
  mkdir -p "$work/rootfs"
  for pkg in "${base[@]}"; do
    dpkg -x "$(ls "$debs/${pkg}"_*.deb | head -1)" "$work/rootfs"
  done
  finish "$work/rootfs" pvisor-default "pvisor default sandbox image (Debian packages)"
  echo "$stamp" >"$work/stamp"
  rm -rf "$dir"
  mv "$work" "$dir"
  echo "sandbox-image: built $dir/rootfs ($(du -sh "$dir/rootfs" | cut -f1))" >&2
fi

# closure_image NAME PRETTY ADD PKG...: an image of the packages' whole
# dependency closure, in OUT_DIR/sandbox-image-NAME, and then what the
# function ADD puts in the rootfs it is given.
closure_image() {
  local name="$1" pretty="$2" add="$3"; shift 3
  local dir="$out/sandbox-image-$name"
  if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -x "$dir/rootfs/bin/sh" ]; then
    return 0
  fi
  local pkgdebs="$out/sandbox-debs-$name"
  download_closure "$pkgdebs" "$@"
  local work="$dir.partial"
  rm -rf "$work"
  mkdir -p "$work/rootfs"
  for deb in "$pkgdebs"/*.deb; do
    dpkg -x "$deb" "$work/rootfs"
  done
  local fs="$work/rootfs"
  finish "$fs" "pvisor-$name" "$pretty"
  # What ca-certificates' maintainer script would generate: the bundle
  # curl, git, pip and Python's ssl module read.
  mkdir -p "$fs/etc/ssl/certs"
  cat "$fs"/usr/share/ca-certificates/mozilla/*.crt >"$fs/etc/ssl/certs/ca-certificates.crt"
  # What update-alternatives would link for a JDK: java, javac, jshell.
  local jdk
  for jdk in "$fs"/usr/lib/jvm/java-*-openjdk-*/bin; do
    [ -d "$jdk" ] || continue
    for tool in java javac jshell jar; do
      [ -e "$jdk/$tool" ] && ln -sfn "${jdk#"$fs"}/$tool" "$fs/usr/bin/$tool"
    done
  done
  "$add" "$fs"
  echo "$stamp" >"$work/stamp"
  rm -rf "$dir"
  mv "$work" "$dir"
  echo "sandbox-image: built $dir/rootfs ($(du -sh "$dir/rootfs" | cut -f1))" >&2
}

# code_interpreter_entrypoint ROOTFS: the entrypoint the OpenSandbox
# code-interpreter image has, /opt/code-interpreter/code-interpreter.sh.
# There it starts Jupyter on 127.0.0.1:${JUPYTER_PORT:-44771}, and the
# code-interpreter SDK's health check connects to that port before it
# trusts the sandbox. pvisor's contexts need no Jupyter (execd starts each
# language's interpreter), so this serves only what the check probes: the
# port, answering Jupyter's `GET /api` with a version, 404 otherwise.
code_interpreter_entrypoint() {
  mkdir -p "$1/opt/code-interpreter"
  cat >"$1/opt/code-interpreter/code-interpreter.sh" <<'SCRIPT'
#!/bin/sh
exec python3 -c '
import http.server, json, os
class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        found = self.path.split("?")[0].rstrip("/") == "/api"
        body = json.dumps({"version": "pvisor"} if found else {"message": "Not Found"}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
port = int(os.environ.get("JUPYTER_PORT") or 44771)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Api).serve_forever()
'
SCRIPT
  chmod 755 "$1/opt/code-interpreter/code-interpreter.sh"
}

closure_image python "pvisor python sandbox image (Debian packages)" : "${base[@]}" "${extra[@]}"
closure_image code-interpreter "pvisor code-interpreter sandbox image (Debian packages)" \
  code_interpreter_entrypoint "${base[@]}" "${extra[@]}" "${interpreters[@]}"
