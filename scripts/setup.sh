#!/usr/bin/env bash
# Install the Debian packages kvserde's build, tests and tools need, only
# those that are missing. Safe to run again; needs root (or sudo) only when
# something is missing.
set -euo pipefail

packages=(
  build-essential   # gcc, make
  cmake
  pkg-config
  libjansson-dev    # JSON: serde and adapter configs
  libhiredis-dev    # the Redis L2 adapter's client library
  redis-server      # Redis L2 adapter tests and benchmark (started by them)
  redis-tools       # redis-cli: the tests build a Redis Cluster with it
  clang             # fuzz targets (libFuzzer) and the TSan build
  libclang-rt-14-dev  # clang's libFuzzer and sanitizer runtimes (make fuzz)
  valgrind          # make valgrind
  gcc-aarch64-linux-gnu  # make aarch64: the portable code compiles for aarch64
  libc6-dev-arm64-cross  # and the aarch64 C library headers it compiles against
  libxxhash-dev     # the xxh3 checksum stage of framed pipelines
  libssl-dev        # the aes_gcm stage: OpenSSL's libcrypto (AES-256-GCM, HKDF-SHA256)
  libisal-dev       # CRC-32C (Intel ISA-L): the crc32c stage and kv_split's checksum
  python3-numpy     # the Python binding's tests: numpy arrays as buffers
  python3-torch     # the Python binding's tests and bench: CPU tensors (bfloat16, float16)
  python3-pytest    # the Python binding's test runner (ctest test python_binding)
  libzstd-dev       # the lossless stage (zstd on byte planes) and eval's zstd baselines
  liblz4-dev        # bench_lossless: the LZ4 baselines
  libopenblas-dev   # the transform stage and `kvserde calibrate`: BLAS products, LAPACK dsyevd
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "kvserde setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
