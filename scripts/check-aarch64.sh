#!/usr/bin/env bash
# Compile every library source for aarch64 with the project's warnings, as
# an aarch64 build would (the *_avx2.c / *_avx512*.c / *_amx.c files are x86-only and
# left out there too), so x86-only code cannot slip into the portable path.
# jansson's, hiredis', libxxhash's, OpenBLAS's and OpenSSL's headers are the same on both
# architectures (LP64), so the host's copies serve (OpenSSL's two generated
# headers, configuration.h and opensslconf.h, sit in the host's multiarch
# directory and are linked in beside the others).
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
command -v "$CC" >/dev/null || { echo "check-aarch64: $CC not found (scripts/setup.sh installs it)" >&2; exit 1; }
inc=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$inc" "$out"' EXIT
ln -s /usr/include/jansson.h /usr/include/jansson_config.h /usr/include/xxhash.h "$inc/"
ln -s /usr/include/hiredis "$inc/hiredis"
ln -s /usr/include/isa-l "$inc/isa-l"
# OpenBLAS's cblas.h and its configuration header: the declarations are the
# same on aarch64 (LP64, 32-bit blasint); the library is only linked on the host.
ln -s /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
  /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h "$inc/"
mkdir "$inc/openssl"
ln -s /usr/include/openssl/*.h "$inc/openssl/"
for h in /usr/include/*-linux-gnu/openssl/*.h; do
  [ -e "$inc/openssl/$(basename "$h")" ] || ln -s "$h" "$inc/openssl/"
done
n=0
while IFS= read -r f; do
  "$CC" -std=c11 -O2 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
    -Wmissing-prototypes -Wformat=2 -Wno-unused-parameter -D_GNU_SOURCE \
    -fvisibility=hidden -fPIC -DKVS_BUILDING_LIBRARY -DKVS_HAVE_X86=0 \
    -I include -I src -isystem "$inc" -c "$f" -o "$out/$n.o"
  n=$((n + 1))
done < <(find src -name '*.c' ! -name '*_avx2.c' ! -name '*_avx512.c' ! -name '*_avx512fp16.c' ! -name '*_avx512vbmi2.c' ! -name '*_amx.c' | sort)
"$CC" -shared -o "$out/libkvserde.so" "$out"/*.o
echo "check-aarch64: $n sources compiled and linked into an aarch64 libkvserde.so"
