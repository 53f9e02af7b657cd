#!/usr/bin/env bash
# Fresh-machine install: the Debian data package (Fashion-MNIST) when missing, then the
# Python package with its dev and opacus extras (torch pinned to the CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist
  else
    echo "warning: no apt-get; Fashion-MNIST experiments need the IDX files (data_dir=...)" >&2
  fi
fi
# ip/tc (iproute2) for the separate-host test (tests/test_netns_hosts.py: network namespaces)
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq iproute2; } || echo "warning: iproute2 not installed; tests/test_netns_hosts.py skips" >&2
  fi
fi
# chromium (headless) for the HTML report's browser test (tests/test_report_html.py)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium; } || echo "warning: chromium not installed; tests/test_report_html.py's browser tests skip" >&2
fi
pip install -e ".[dev,opacus]" -c constraints.txt
