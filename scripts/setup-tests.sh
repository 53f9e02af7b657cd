#!/usr/bin/env bash
# The test set-up (README, "Set up"; .ci/run runs it): what only the tests need, on top of the
# user's install (`pip install -e .`, no root).
#
# Debian packages, each only when missing, with --no-install-recommends (libraries only: no
# daemon, no systemd/dbus service; needs root or sudo):
#   dataset-fashion-mnist    Fashion-MNIST IDX files (31 MB) for the horizontal reproduction's tests
#   iproute2                 ip/tc for tests/test_netns_hosts.py (parties on separate network namespaces)
#   chromium-headless-shell  a headless browser for tests/test_report_html.py (renders report.html);
#                            chromium itself would pull dconf -> dbus-daemon + systemd
# Python: the dev (pytest), opacus (rdp/prv accountants; torch pinned to the CPU build by
# constraints.txt) and horizontal (flwr-datasets) extras.
# Without apt-get (or root/sudo) the Debian part is skipped with a warning; the tests that need it skip.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing+=(dataset-fashion-mnist)
{ command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; } || missing+=(iproute2)
{ command -v chromium >/dev/null 2>&1 || command -v chromium-headless-shell >/dev/null 2>&1; } \
  || missing+=(chromium-headless-shell)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && SUDO="sudo"
  fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    echo "apt-get install --no-install-recommends ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "warning: not installed (no apt-get, or neither root nor sudo): ${missing[*]}; the tests that need them skip" >&2
  fi
fi
python -m pip install -e ".[dev,opacus,horizontal]" -c constraints.txt
