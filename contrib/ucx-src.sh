#!/usr/bin/env bash
# Prepare a UCX source tree whose internal headers and config.h match the
# installed UCX build, so that rc_vqp can include uct/base/*.h and friends.
#
# usage: contrib/ucx-src.sh --dest DIR [--ucx-prefix PREFIX]
#        contrib/ucx-src.sh --source-version DIR   (prints a tree's version)
#
# - reads the installed UCX version (pkg-config / uct/api/version.h);
# - fetches the Debian source package of exactly that version (apt-get source);
# - runs UCX's own configure with the options the installed build used
#   ("Configured with:" from ucx_info -v): only config.h is needed, nothing is
#   built. The macros in config.h change struct layouts (ENABLE_ASSERT,
#   ENABLE_STATS, ENABLE_DEBUG_DATA, ...), so guessing them is not safe.
# Prints the prepared source directory on the last line of stdout.
set -euo pipefail

dest=""
prefix="/usr"

# Version of a UCX source tree, from the ucx_ver_* macros of its configure.ac.
source_version() {
    sed -n 's/^define(\[ucx_ver_\(major\|minor\|patch\)\], *\([0-9]*\)).*/\2/p' \
        "$1/configure.ac" | paste -sd.
}
while [ $# -gt 0 ]; do
    case "$1" in
    --dest) dest="$2"; shift 2 ;;
    --ucx-prefix) prefix="$2"; shift 2 ;;
    --source-version) source_version "$2"; exit 0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "ucx-src.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ -n "$dest" ] || { echo "ucx-src.sh: --dest DIR is required" >&2; exit 2; }

die() { echo "ucx-src.sh: error: $*" >&2; exit 1; }
log() { echo "ucx-src.sh: $*" >&2; }

verh="$prefix/include/uct/api/version.h"
[ -r "$verh" ] || die "no $verh: install libucx-dev (apt-get install libucx-dev ucx-utils) or pass --ucx-prefix"
ver=$(sed -n 's/^#define UCT_VERNO_STRING *"\(.*\)"/\1/p' "$verh")
[ -n "$ver" ] || die "cannot read UCT_VERNO_STRING from $verh"

stamp="$dest/.rc_vqp-prepared"
if [ -r "$stamp" ] && [ "$(cat "$stamp")" = "$ver" ] && [ -r "$dest/config.h" ]; then
    log "reusing prepared UCX $ver source in $dest"
    echo "$dest"
    exit 0
fi

ucx_info="$prefix/bin/ucx_info"
[ -x "$ucx_info" ] || ucx_info=$(command -v ucx_info || true)
[ -n "$ucx_info" ] || die "ucx_info not found: install ucx-utils (it tells how the installed UCX was configured)"
opts=$("$ucx_info" -v | sed -n 's/^# Configured with: //p')
[ -n "$opts" ] || die "'$ucx_info -v' printed no 'Configured with:' line"
# The options are single words such as --includedir=${prefix}/include: split
# them without letting the shell expand anything.
read -ra cfg_opts <<<"$opts"

debver=$(dpkg-query -W -f='${Version}' libucx-dev 2>/dev/null || true)
work=$(mktemp -d "${TMPDIR:-/tmp}/rc_vqp-ucx-src.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching the Debian source of UCX $ver (package version ${debver:-unknown})"
if ! (cd "$work" && apt-get source -q ${debver:+"ucx=$debver"} >"$work/apt.log" 2>&1); then
    cat "$work/apt.log" >&2
    die "apt-get source ucx${debver:+=$debver} failed. Add a deb-src line for your Debian release
  (e.g. /etc/apt/sources.list.d/debian-src.sources with 'Types: deb-src'), run apt-get update,
  and install dpkg-dev; or unpack the UCX $ver source yourself and pass --with-ucx-src=DIR to configure."
fi
src=$(find "$work" -maxdepth 1 -type d -name 'ucx-*' | head -n 1)
[ -n "$src" ] || die "apt-get source produced no ucx-* directory"

src_ver=$(source_version "$src")
[ "$src_ver" = "$ver" ] || die "fetched UCX source is $src_ver but the installed UCX is $ver"

# The orig tarball's autogen expects debian/ (Debian's packaging ships it as debian.upstream).
[ -d "$src/debian" ] || cp -r "$src/debian.upstream" "$src/debian"
log "running UCX's configure with the installed build's options (config.h only)"
(cd "$src" && ./autogen.sh >"$work/autogen.log" 2>&1) || { cat "$work/autogen.log" >&2; die "UCX autogen.sh failed (needs autoconf automake libtool)"; }
(cd "$src" && ./configure "${cfg_opts[@]}" >"$work/configure.log" 2>&1) || { tail -30 "$work/configure.log" >&2; die "UCX configure failed (needs libnuma-dev, libibverbs-dev)"; }

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$src" "$dest"
echo "$ver" >"$stamp"
log "prepared UCX $ver source in $dest"
echo "$dest"
