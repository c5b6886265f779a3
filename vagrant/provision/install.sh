#!/usr/bin/env bash
# Provision one Gazette node (a Debian VM), idempotently: run it again and it changes only
# what differs, restarting the node's services only if something did.
#
#   install.sh [--repo DIR] [--roles "etcd broker summer word-count s3"] [--apply] [--dest DIR]
#              VAR=VALUE...
#
# - Debian packages: etcd-server (Debian's own etcd.service is masked: ours runs the member),
#   fuse3 and the headers and compilers the package's native pieces build with.
# - The package from the repository (--repo, default /vagrant) into the venv /opt/gazette/venv
#   (`pip install REPO[broker,consumer,rocksdb,s3,sqlite]`, plus moto's server on an s3 node), the examples' applications to
#   /opt/gazette/examples and gazette-node to /usr/local/bin: the node runs without the synced
#   folder mounted.
# - /etc/gazette/node.env from the VAR=VALUE arguments (the variables of gazette-node; any
#   AWS_* credentials), plus GAZETTE_PYTHON and GAZETTE_EXAMPLES.
# - The units of --roles, enabled and started (not waited for: etcd has no quorum until enough
#   VMs are up, and the services retry until it does).
# - --apply (one node, provisioned last): wait for this node's services, then apply the
#   journal and shard specs (gazette-node apply-journals, apply-shards).
#
# --dest DIR lays the node's files down under DIR instead of / (gazette-node, the examples,
# node.env, the units; paths inside them stay the node's own) and nothing else: no Debian
# packages, no venv, no systemctl. tests/vagrant/test_provision.py runs it so. systemctl is
# also skipped, the units only written, where systemd is not running (a container).
set -euo pipefail

REPO=/vagrant
ROLES="etcd broker"
APPLY=0
DEST=
VARS=()
while (($#)); do
  case "$1" in
    --repo) REPO="$2"; shift 2 ;;
    --roles) ROLES="$2"; shift 2 ;;
    --apply) APPLY=1; shift ;;
    --dest) DEST="${2%/}"; shift 2 ;;
    *=*) VARS+=("$1"); shift ;;
    *) echo "install.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [[ $EUID -ne 0 ]]; then
  echo "install.sh: run as root" >&2
  exit 1
fi
if [[ -n $DEST && $APPLY -eq 1 ]]; then
  echo "install.sh: --apply goes through the node's running services: not with --dest" >&2
  exit 2
fi

PREFIX=/opt/gazette
VENV=$PREFIX/venv
ENV_FILE=/etc/gazette/node.env
HERE=$REPO/vagrant/provision
CHANGED=0

log() { echo "install.sh: $*"; }

# Copy $1 to $2 (mode $3) unless identical; remember that something changed.
put() {
  if ! cmp -s "$1" "$2"; then
    install -D -m "$3" "$1" "$2"
    CHANGED=1
    log "updated $2"
  fi
}

has_role() { [[ " $ROLES " == *" $1 "* ]]; }

SYSTEMCTL=1
if [[ -n $DEST ]]; then
  SYSTEMCTL=0
  log "files under $DEST only: no packages, no venv, no systemctl"
elif [[ ! -d /run/systemd/system ]]; then
  SYSTEMCTL=0
  log "systemd is not running: units written, not enabled or started"
fi

if [[ -z $DEST ]]; then
  # -- Debian packages
  PACKAGES=(etcd-server fuse3 libfuse3-dev pkg-config build-essential python3-dev python3-venv
    librocksdb-dev libsqlite3-dev)
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi

  # -- The package, in a venv: reinstalled only when its sources changed.
  [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
  # Every server extra; not [spark] (pyspark is for exports, run elsewhere).
  extras=("${REPO}[broker,consumer,rocksdb,s3,sqlite]")
  has_role s3 && extras+=("moto[server]>=5.0")
  # Built native pieces (*.so, rocksdb-scan) may land in src/: they are not sources.
  stamp=$(cd "$REPO" && find src pyproject.toml setup.py -type f ! -name '*.so' ! -name rocksdb-scan \
    ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  stamp="$stamp ${extras[*]}"
  if [[ "$(cat "$VENV/.gazette-installed" 2>/dev/null || true)" != "$stamp" ]]; then
    log "installing the package into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "${extras[@]}"
    echo "$stamp" >"$VENV/.gazette-installed"
    CHANGED=1
  fi
fi
# The Debian package starts a single-member etcd of its own: ours replaces it.
if ((SYSTEMCTL)) && [[ "$(systemctl is-enabled etcd.service 2>/dev/null || true)" != masked ]]; then
  systemctl disable --now etcd.service >/dev/null 2>&1 || true
  systemctl mask etcd.service
fi

# -- The node script and the examples' applications
put "$HERE/gazette-node" "$DEST/usr/local/bin/gazette-node" 0755
mkdir -p "$DEST$PREFIX/examples"
for app in stream-sum word-count; do
  to=$DEST$PREFIX/examples/$app
  if ! diff -qr --exclude=__pycache__ "$REPO/examples/$app" "$to" >/dev/null 2>&1; then
    rm -rf "${to:?}"
    cp -r "$REPO/examples/$app" "$to"
    CHANGED=1
    log "updated $to"
  fi
done

# -- /etc/gazette/node.env: the arguments, then what this script decides. Values are quoted
# for systemd's EnvironmentFile and for the shell alike (no quotes or backslashes in them).
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
  echo "# Written by vagrant/provision/install.sh: the variables of gazette-node."
  for kv in "${VARS[@]}" "GAZETTE_PYTHON=$VENV/bin/python" "GAZETTE_EXAMPLES=$PREFIX/examples"; do
    key=${kv%%=*}
    value=${kv#*=}
    if [[ ! $key =~ ^(GAZETTE|AWS)_[A-Z0-9_]+$ || $value == *[\"\\]* ]]; then
      echo "install.sh: refusing variable $key (GAZETTE_* or AWS_*, no quotes in values)" >&2
      exit 2
    fi
    echo "$key=\"$value\""
  done
} >"$tmp"
put "$tmp" "$DEST$ENV_FILE" 0600

# -- systemd units of the roles
units=()
for role in $ROLES; do
  unit=gazette-$role.service
  [[ -f $HERE/units/$unit ]] || { echo "install.sh: no unit for role $role" >&2; exit 2; }
  put "$HERE/units/$unit" "$DEST/etc/systemd/system/$unit" 0644
  units+=("$unit")
done
if ((SYSTEMCTL)); then
  systemctl daemon-reload
  systemctl enable "${units[@]}" >/dev/null
  if ((CHANGED)); then
    log "(re)starting ${units[*]}"
    systemctl restart --no-block "${units[@]}"
  else
    systemctl start --no-block "${units[@]}"
  fi
fi

# -- The specs, once, from the node given --apply
if ((APPLY)); then
  set -a
  # shellcheck source=/dev/null
  . "$ENV_FILE"
  set +a
  for role in $ROLES; do
    log "waiting for $role"
    /usr/local/bin/gazette-node "$role" --wait 300
  done
  /usr/local/bin/gazette-node apply-journals
  /usr/local/bin/gazette-node apply-shards
  log "specs applied"
fi
