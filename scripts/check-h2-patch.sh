#!/usr/bin/env bash
# Checks that third_party/h2 is the crates.io release of h2 named in its
# Cargo.toml plus exactly third_party/h2/ephd.patch, nothing else
# (third_party/h2/EPHD-PATCH.md says why the patch exists).
#
# It fetches the pristine release with `cargo vendor` into a temporary
# directory, applies the patch there and compares the two trees; crates.io
# packaging files that are not part of the source are left out.
#
#   scripts/check-h2-patch.sh            # exit 0: the copy is release + patch
#   KEEP=1 scripts/check-h2-patch.sh     # also keep the temporary directory
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vendored="$root/third_party/h2"
patch_file="$vendored/ephd.patch"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$vendored/Cargo.toml" | head -n 1)
[ -n "$version" ] || { echo "no version in $vendored/Cargo.toml" >&2; exit 1; }

tmp=$(mktemp -d)
if [ -z "${KEEP:-}" ]; then
    trap 'rm -rf "$tmp"' EXIT
else
    echo "keeping $tmp"
fi

# A throw-away crate whose only dependency is the exact h2 release.
mkdir -p "$tmp/probe/src"
cat > "$tmp/probe/Cargo.toml" <<EOF
[package]
name = "h2-probe"
version = "0.0.0"
edition = "2021"

[dependencies]
h2 = "=$version"
EOF
touch "$tmp/probe/src/lib.rs"
(cd "$tmp/probe" && cargo vendor --quiet --versioned-dirs "$tmp/vendor" > /dev/null)
pristine="$tmp/vendor/h2-$version"
[ -d "$pristine" ] || { echo "cargo vendor did not produce $pristine" >&2; exit 1; }

cp -r "$pristine" "$tmp/expected"
(cd "$tmp/expected" && patch --quiet -p1 < "$patch_file")

# Packaging files of crates.io and cargo vendor (which also drops the
# crate's .gitignore), and the two ephd files.
excludes=(-x .cargo-checksum.json -x .cargo_vcs_info.json -x .cargo-ok -x Cargo.lock
    -x .gitignore -x target -x EPHD-PATCH.md -x ephd.patch)
if diff -r "${excludes[@]}" "$tmp/expected" "$vendored"; then
    echo "third_party/h2 is h2 $version plus ephd.patch, nothing else"
else
    echo "third_party/h2 differs from h2 $version plus ephd.patch (above)" >&2
    exit 1
fi
